"""Temporal workers: `gpu` (profile, verify, benchmark, deploy), `cpu` (workflow, author, skills), `all`."""
