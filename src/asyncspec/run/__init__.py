"""What the commands, benchmarks and profiling share: models and producers from the options,
audio windows as decode jobs, running methods side by side against target-only, summaries.

Nothing here imports `asyncspec.commands`; the commands are thin layers on top."""
