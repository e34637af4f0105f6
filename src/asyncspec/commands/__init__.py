"""Command implementations behind the `asyncspec` CLI (argument parsing lives in cli.py)."""
