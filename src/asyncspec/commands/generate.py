"""`asyncspec generate`: a raw text prompt -> the target's continuation."""

from __future__ import annotations

from asyncspec.errors import InputError
from asyncspec.models.hf_causal import CausalLMBackend
from asyncspec.run.compare import equality_check, methods_to_run, print_summary, run_jobs
from asyncspec.run.config import decode_config
from asyncspec.run.models import load_models


def run(args) -> int:
    if not args.prompt.strip():
        raise InputError("the prompt is empty")
    args.methods = methods_to_run(args.methods, args.compare)
    config = decode_config(args)
    if "as2d" in args.methods:
        raise InputError("as2d drafts from audio; for text use target, sd or specasr")
    with load_models(args, CausalLMBackend, "text") as (target, drafters):
        request = target.request(args.prompt, max_new_tokens=args.max_new_tokens)
        jobs = [({"prompt_tokens": len(request.prompt_ids), "where": "the prompt"}, request)]
        exactness = equality_check(target, config, args.compare)
        records = run_jobs(target, drafters, jobs, args.methods, config, args.json, args.trace, exactness)
    return print_summary(records, args.json, exactness)
