"""Evaluation workloads: HumanEval and GSM8K prompts, request arrival schedules, task-quality scorers."""
