"""OpenAI-compatible HTTP endpoints on the edge (FastAPI): /v1/completions, /v1/chat/completions
(both with `stream`), /v1/models. `temperature=0` is greedy; /v1/completions feeds the raw prompt
exactly as `asyncspec generate --prompt` does. Extension: `eps_req` (per-request TV budget)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.client import IncrementalText

DEFAULT_MAX_TOKENS = 16


class ChatFormatter:
    """Messages -> prompt text with the model's chat template, or a plain transcript without one."""

    def __init__(self, hf_tokenizer=None):
        self.hf_tokenizer = hf_tokenizer if getattr(hf_tokenizer, "chat_template", None) else None

    def __call__(self, messages: list[dict]) -> str:
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join([*lines, "assistant:"])


class BadRequest(ValueError):
    pass


def _options(body: dict) -> tuple[int, wire.Sampling, float]:
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
    temperature = body.get("temperature")
    temperature = 1.0 if temperature is None else temperature
    seed = body.get("seed") or 0
    eps_req = body.get("eps_req") or 0.0
    valid = (
        isinstance(max_tokens, int)
        and max_tokens >= 1
        and isinstance(temperature, int | float)
        and temperature >= 0
        and isinstance(seed, int)
        and isinstance(eps_req, int | float)
        and eps_req >= 0
    )
    if not valid:
        raise BadRequest("max_tokens must be >= 1, temperature >= 0, seed an integer, eps_req >= 0")
    return max_tokens, wire.Sampling(wire.f32(float(temperature)), seed), float(eps_req)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)


def make_app(gateway, tokenizer, model_name: str, chat: ChatFormatter | None = None) -> FastAPI:
    app = FastAPI(title="asyncspec edge")
    chat = chat or ChatFormatter()

    async def events(ids: list[int], max_tokens: int, sampling: wire.Sampling, eps_req: float) -> AsyncIterator[dict]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        gateway.submit(
            ids, max_tokens, sampling, eps_req, lambda event: loop.call_soon_threadsafe(queue.put_nowait, event)
        )
        while True:
            event = await queue.get()
            yield event
            if event["type"] != "token":
                return

    async def serve(body: dict, prompt: str, kind: str):
        max_tokens, sampling, eps_req = _options(body)
        ids = tokenizer.encode(prompt)
        if not ids:
            raise BadRequest("the prompt is empty")
        stream = events(ids, max_tokens, sampling, eps_req)
        meta = {"id": f"{kind}-{uuid.uuid4().hex[:16]}", "created": int(time.time()), "model": model_name}
        if body.get("stream"):
            return StreamingResponse(_sse(stream, tokenizer, meta, kind), media_type="text/event-stream")
        text, final = IncrementalText(tokenizer), None
        async for event in stream:
            if event["type"] == "token":
                text.add(event["token"])
            final = event
        if final["type"] == "error":
            return _error(503, final["message"])
        return _response(kind, meta, text.text(), final, len(ids))

    @app.post("/v1/completions")
    async def completions(body: dict):
        try:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            if not isinstance(prompt, str):
                raise BadRequest("prompt must be a string")
            return await serve(body, prompt, "cmpl")
        except BadRequest as error:
            return _error(400, str(error))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: dict):
        try:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(_is_message(m) for m in messages):
                raise BadRequest("messages must be a non-empty list of {role, content}")
            return await serve(body, chat(messages), "chatcmpl")
        except BadRequest as error:
            return _error(400, str(error))

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "asyncspec"}]}

    return app


def _is_message(message) -> bool:
    return (
        isinstance(message, dict) and isinstance(message.get("role"), str) and isinstance(message.get("content"), str)
    )


def _finish_reason(event: dict) -> str:
    return "stop" if event.get("finish_reason") == "eos" else "length"


def _response(kind: str, meta: dict, text: str, final: dict, prompt_tokens: int) -> dict:
    completion_tokens = len(final["tokens"])
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if kind == "cmpl":
        choice = {"index": 0, "text": text, "finish_reason": _finish_reason(final), "logprobs": None}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": _finish_reason(final)}
        obj = "chat.completion"
    # the token ids too: a client can check them against target-only decoding (`asyncspec generate`)
    extension = {**final["stats"], "token_ids": list(final["tokens"])}
    return {**meta, "object": obj, "choices": [choice], "usage": usage, "asyncspec": extension}


async def _sse(stream: AsyncIterator[dict], tokenizer, meta: dict, kind: str) -> AsyncIterator[str]:
    text = IncrementalText(tokenizer)
    obj = "text_completion" if kind == "cmpl" else "chat.completion.chunk"

    def chunk(piece: str | None, finish: str | None, first: bool = False) -> str:
        if kind == "cmpl":
            choice = {"index": 0, "text": piece or "", "finish_reason": finish, "logprobs": None}
        else:
            delta = {"role": "assistant", "content": ""} if first else ({"content": piece} if piece else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return f"data: {json.dumps({**meta, 'object': obj, 'choices': [choice]})}\n\n"

    if kind != "cmpl":
        yield chunk(None, None, first=True)
    async for event in stream:
        if event["type"] == "token":
            piece = text.add(event["token"])
            if piece:
                yield chunk(piece, None)
        elif event["type"] == "done":
            yield chunk(None, _finish_reason(event))
        else:
            yield f"data: {json.dumps({'error': {'message': event['message']}})}\n\n"
    yield "data: [DONE]\n\n"
