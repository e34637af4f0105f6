"""The fields of an OpenAI completion request the edge accepts, each checked once, here.

Implemented: `max_tokens`, `temperature`, `seed`, `stream`, `stop` (stop_strings.py), `top_p`,
`presence_penalty` and `frequency_penalty` (shaping.py: the drafter's and the target's laws alike),
`logprobs` (an integer of alternatives for /v1/completions; true with `top_logprobs` for chat; up
to 5; logprobs.py), `user` (accepted and not used, as OpenAI defines it: an end-user id for abuse
monitoring). Every field the edge does not implement (`n` > 1, `best_of`, `logit_bias`, `echo`,
`suffix`, `tools`, and `logprobs` with `stream`) is refused with a 400 when set to anything but its
neutral value, never silently ignored: a client that asks for a logit bias must learn it gets none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.logprobs import NOT_ASKED
from asyncspec.cloudedge.requests import NO_OPTIONS, OutputOptions
from asyncspec.cloudedge.stop_strings import StopStrings, parse_stop, stop_problem
from asyncspec.cloudedge.validation import MAX_TOP_LOGPROBS, sampling_problem
from asyncspec.shaping import shaping_problem

DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_CAP = 4096  # beyond any served model's positions
MAX_PROMPT_CHARS = 200_000  # tokenizing more would hold a worker thread for long

# field -> the neutral values (besides null) a client may send without asking for anything
UNSUPPORTED: dict[str, tuple] = {
    "n": (1,),
    "best_of": (1,),
    "logit_bias": ({},),
    "echo": (False,),
    "suffix": ("",),
    "tools": ([],),
}


class BadRequest(ValueError):
    """A request the edge refuses with HTTP 400; the message names the field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class CompletionOptions:
    max_tokens: int
    sampling: wire.Sampling
    eps_req: float
    stream: bool
    output: OutputOptions = NO_OPTIONS


def parse_options(body: dict) -> CompletionOptions:
    _refuse_unsupported(body)
    _check_user(body)
    stream = _stream(body)
    output = OutputOptions(_stops(body), _logprobs(body))
    if stream and output.logprobs != NOT_ASKED:
        raise BadRequest("logprobs with stream=true is not supported by this server", "logprobs")
    return CompletionOptions(_max_tokens(body), _sampling(body), _eps_req(body), stream, output)


def _logprobs(body: dict) -> int:
    """Alternatives per token (NOT_ASKED: none asked): /v1/completions' integer `logprobs`, or chat's
    `logprobs: true` with `top_logprobs`."""
    asked, top = body.get("logprobs"), body.get("top_logprobs")
    if asked is None or asked is False:
        if top not in (None, 0):
            raise BadRequest("top_logprobs needs logprobs=true", "top_logprobs")
        return NOT_ASKED
    count = (0 if top is None else top) if asked is True else asked
    if not _is_int(count) or not 0 <= count <= MAX_TOP_LOGPROBS:
        name = "top_logprobs" if asked is True else "logprobs"
        raise BadRequest(f"{name} must be an integer between 0 and {MAX_TOP_LOGPROBS}", name)
    return count


def parse_prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest("prompt must be a string (or a list of one string)", "prompt")
    return _checked_text(prompt, "prompt")


def parse_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(_is_message(m) for m in messages):
        raise BadRequest("messages must be a non-empty list of {role, content} with string values", "messages")
    _checked_text("".join(m["content"] for m in messages), "messages")
    return messages


def _checked_text(text: str, name: str) -> str:
    if not text:
        raise BadRequest(f"the {name} is empty", name)
    if len(text) > MAX_PROMPT_CHARS:
        raise BadRequest(f"the {name} exceeds {MAX_PROMPT_CHARS} characters", name)
    return text


def _is_message(message) -> bool:
    return (
        isinstance(message, dict) and isinstance(message.get("role"), str) and isinstance(message.get("content"), str)
    )


def _refuse_unsupported(body: dict) -> None:
    for name, neutral in UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and not any(value == ok and type(value) is type(ok) for ok in neutral):
            raise BadRequest(f"{name}={value!r} is not supported by this server", name)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _max_tokens(body: dict) -> int:
    value = body.get("max_tokens", body.get("max_completion_tokens"))
    if value is None:
        return DEFAULT_MAX_TOKENS
    if not _is_int(value) or not 1 <= value <= MAX_TOKENS_CAP:
        raise BadRequest(f"max_tokens must be an integer between 1 and {MAX_TOKENS_CAP}", "max_tokens")
    return value


def _sampling(body: dict) -> wire.Sampling:
    temperature = body.get("temperature")
    temperature = 1.0 if temperature is None else temperature
    seed = body.get("seed")
    seed = 0 if seed is None else seed
    problem = sampling_problem(temperature, seed)
    if problem:
        raise BadRequest(problem, "temperature" if problem.startswith("temperature") else "seed")
    shaping = [_or_default(body, name, default) for name, default in SHAPING_FIELDS]
    problem = shaping_problem(*shaping)
    if problem:
        raise BadRequest(problem, problem.split()[0])
    return wire.Sampling(wire.f32(float(temperature)), seed, *(wire.f32(float(value)) for value in shaping))


SHAPING_FIELDS = (("top_p", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0))


def _or_default(body: dict, name: str, default: float):
    value = body.get(name)
    return default if value is None else value


def _stops(body: dict) -> StopStrings:
    problem = stop_problem(body.get("stop"))
    if problem:
        raise BadRequest(problem, "stop")
    return parse_stop(body.get("stop"))


MAX_USER_CHARS = 256


def _check_user(body: dict) -> None:
    user = body.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > MAX_USER_CHARS):
        raise BadRequest(f"user must be a string of at most {MAX_USER_CHARS} characters", "user")


def _eps_req(body: dict) -> float:
    value = body.get("eps_req")
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= 1:
        raise BadRequest("eps_req must be a number within [0, 1]", "eps_req")
    return float(value)


def _stream(body: dict) -> bool:
    value = body.get("stream")
    if value is not None and not isinstance(value, bool):
        raise BadRequest("stream must be true or false", "stream")
    return bool(value)
