"""Temporal workflows. Nothing here imports torch: workflow code runs in Temporal's sandbox."""
