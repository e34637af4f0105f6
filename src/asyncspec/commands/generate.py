"""`asyncspec generate`: a raw text prompt -> the target's continuation."""

from __future__ import annotations

from asyncspec.commands.report import emit, result_record
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.errors import InputError
from asyncspec.models.hf_causal import CausalLMBackend


def run(args) -> int:
    from asyncspec.models.registry import load_decoder

    if not args.prompt.strip():
        raise InputError("the prompt is empty")
    target = load_decoder(args.model, args.dtype)
    if not isinstance(target, CausalLMBackend):
        raise InputError(f"{args.model} is not a text model")
    request = target.request(args.prompt, max_new_tokens=args.max_new_tokens)
    config = DecodeConfig(temperature=args.temperature, seed=args.seed)
    for method in args.methods:
        result = METHODS[method](target, None, request, config)
        emit(result_record(result, target, prompt_tokens=len(request.prompt_ids)), args.json)
    return 0
