"""`asyncspec generate`: a raw text prompt -> the target's continuation."""

from __future__ import annotations

from asyncspec.errors import InputError
from asyncspec.models.hf_causal import CausalLMBackend
from asyncspec.run.compare import equality_check, methods_to_run, print_summary, run_jobs
from asyncspec.run.models import load_models
from asyncspec.run.options import DecodingOptions, decode_config


def run(args) -> int:
    if not args.prompt.strip():
        raise InputError("the prompt is empty")
    options = DecodingOptions.from_args(args)
    options = options.running(methods_to_run(options.methods, options.compare))
    config = decode_config(options)
    if "as2d" in options.methods:
        raise InputError("as2d drafts from audio; for text use target, sd or specasr")
    with load_models(options, CausalLMBackend, "text") as (target, drafters):
        request = target.request(args.prompt, max_new_tokens=args.max_new_tokens)
        jobs = [({"prompt_tokens": len(request.prompt_ids), "where": "the prompt"}, request)]
        exactness = equality_check(target, config, options.compare)
        records = run_jobs(target, drafters, jobs, options.methods, config, options.trace, exactness)
    return print_summary(records, exactness, args.json)
