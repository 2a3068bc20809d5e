"""Subcommands of the `gpuyantra` CLI, one module each."""
