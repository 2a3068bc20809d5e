"""The campaign contract: what `OptimizeCampaign` (workflows/campaign.py) takes, what its activities
take and return, how its input is checked, and the campaign's own gates on a verdict.

Stdlib only (no torch, no Temporal): the workflow sandbox imports it, and so do the CLI, the
activities and the clients. The app (`workflows/`, `activities/`) imports this package; nothing here
imports the app."""
