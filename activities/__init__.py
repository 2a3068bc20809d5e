"""Temporal activities: thin adapters from workflow inputs to the `gpuyantra` core."""
