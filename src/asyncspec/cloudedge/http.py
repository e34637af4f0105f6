"""OpenAI-compatible HTTP endpoints on the edge (FastAPI): /v1/completions, /v1/chat/completions
(both with `stream`), /v1/models. `temperature=0` is greedy; /v1/completions feeds the raw prompt
exactly as `asyncspec generate --prompt` does. Extension: `eps_req` (per-request TV budget).
Fields are checked in http_options.py (OpenAI-style 400s); the app is wrapped in httpguard.Guard
(API key, Host allow-list, body cap); a client that disconnects cancels its request."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from asyncspec.cloudedge.client import IncrementalText
from asyncspec.cloudedge.edge_metrics import EdgeMetrics
from asyncspec.cloudedge.http_logprobs import rendered_logprobs
from asyncspec.cloudedge.http_options import BadRequest, CompletionOptions, parse_messages, parse_options, parse_prompt
from asyncspec.cloudedge.logprobs import NOT_ASKED
from asyncspec.cloudedge.requests import DoneEvent, EdgeEvent, ErrorEvent, TokenEvent
from asyncspec.cloudedge.stop_strings import StopStrings, StreamedCut
from asyncspec.httpguard import Guard, GuardConfig, install_error_handlers
from asyncspec.metrics import add_metrics_route

DISCONNECT_CHECK_S = 1.0  # how often a waiting request looks whether its client is still there


class ChatFormatter:
    """Messages -> prompt text with the model's chat template, or a plain transcript without one."""

    def __init__(self, hf_tokenizer=None):
        self.hf_tokenizer = hf_tokenizer if getattr(hf_tokenizer, "chat_template", None) else None

    def __call__(self, messages: list[dict]) -> str:
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join([*lines, "assistant:"])


def readiness_problems(gateway) -> list[str]:
    """Why the edge cannot serve a completion now (empty: it can): the cloud has not introduced
    itself, or has been silent for longer than a heartbeat and the dead-after delay."""
    if gateway.cloud is None:
        return ["the cloud verifier has not answered yet"]
    silent = time.monotonic() - gateway.liveness.last_heard
    limit = gateway.policy.heartbeat_s + gateway.policy.dead_after_s
    return [f"the cloud verifier has been silent for {silent:.1f} s (limit {limit:.1f} s)"] if silent > limit else []


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


def _failed(final: ErrorEvent) -> JSONResponse:
    """A request the edge or the cloud could not complete: 429 (retry later) when refused for lack of
    room, as OpenAI clients expect for back-pressure; 503 otherwise."""
    if final.capacity:
        body = {"error": {"message": final.message, "type": "rate_limit_exceeded", "param": None, "code": None}}
        return JSONResponse(body, status_code=429, headers={"Retry-After": "1"})
    return _error(503, final.message)


async def _json_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body())
    except (ValueError, RecursionError) as error:  # RecursionError: nesting deeper than the parser's stack
        raise BadRequest(f"the body is not valid JSON ({type(error).__name__})") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def make_app(gateway, tokenizer, model_name: str, chat: ChatFormatter | None = None, guard: GuardConfig | None = None):
    """The OpenAI-compatible completions endpoints over the edge gateway, inside httpguard.Guard."""
    app = FastAPI(title="asyncspec edge")
    install_error_handlers(app)
    chat = chat or ChatFormatter()

    @app.post("/v1/completions")
    async def completions(client: Request):
        try:
            body = await _json_body(client)
            return await complete(gateway, tokenizer, model_name, client, body, parse_prompt(body), "cmpl")
        except BadRequest as error:
            return _error(400, str(error), error.param)

    @app.post("/v1/chat/completions")
    async def chat_completions(client: Request):
        try:
            body = await _json_body(client)
            return await complete(gateway, tokenizer, model_name, client, body, chat(parse_messages(body)), "chatcmpl")
        except BadRequest as error:
            return _error(400, str(error), error.param)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "asyncspec"}]}

    @app.get("/health")
    async def health():
        """Liveness: the HTTP front answers (the gateway's loop is checked by /ready)."""
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        problems = readiness_problems(gateway)
        body = {"status": "ready" if not problems else "not ready", "problems": problems}
        return JSONResponse(body, status_code=200 if not problems else 503)

    add_metrics_route(app, EdgeMetrics(gateway).registry)  # inside the Guard, like /health: a key if /v1 needs one
    return Guard(app, guard or GuardConfig())


async def gateway_events(
    gateway, ids: list[int], options: CompletionOptions, client: Request
) -> AsyncIterator[EdgeEvent]:
    """The request's events; a client that disconnects cancels its generation at the edge."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    request_id = gateway.submit(
        ids,
        options.max_tokens,
        options.sampling,
        options.eps_req,
        lambda event: loop.call_soon_threadsafe(queue.put_nowait, event),
        options.output,
    )
    finished, checked = False, time.monotonic()
    try:
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), DISCONNECT_CHECK_S)
            except TimeoutError:
                event = None
            if time.monotonic() - checked >= DISCONNECT_CHECK_S:  # also while tokens keep coming
                checked = time.monotonic()
                if await client.is_disconnected():
                    return
            if event is None:
                continue
            finished = not isinstance(event, TokenEvent)
            yield event
            if finished:
                return
    finally:
        if not finished:
            gateway.cancel(request_id)


async def complete(gateway, tokenizer, model_name: str, client: Request, body: dict, prompt: str, kind: str):
    """One completion (`kind` cmpl or chatcmpl): streamed as server-sent events, or whole."""
    options = parse_options(body)
    ids = await asyncio.to_thread(tokenizer.encode, prompt)  # long prompts must not stall the event loop
    if not ids:
        raise BadRequest("the prompt is empty", "prompt")
    positions = gateway.drafter.max_length
    if len(ids) >= positions:  # no room for a single generated token
        raise BadRequest(f"the prompt ({len(ids)} tokens) exceeds the model's {positions} positions", "prompt")
    stream = gateway_events(gateway, ids, options, client)
    meta = {"id": f"{kind}-{uuid.uuid4().hex[:16]}", "created": int(time.time()), "model": model_name}
    if options.stream:
        sse = _sse(stream, tokenizer, meta, kind, options.output.stops)
        return StreamingResponse(sse, media_type="text/event-stream")
    text, final, entries = IncrementalText(tokenizer), None, []
    async for event in stream:
        if isinstance(event, TokenEvent):
            text.add(event.token)
            entries.append(event.logprob)
        final = event
    if isinstance(final, DoneEvent):
        response = _response(kind, meta, options.output.stops.cut(text.text())[0], final, len(ids))
        if options.output.logprobs != NOT_ASKED:
            response["choices"][0]["logprobs"] = rendered_logprobs(kind, final.tokens, entries, tokenizer.decode)
        return response
    if isinstance(final, ErrorEvent):
        return _failed(final)
    return _error(499, "the client disconnected")  # the stream stopped before its end


def _finish_reason(event: DoneEvent) -> str:
    """OpenAI's: "stop" at the end of sequence or a stop string, "length" at max_tokens."""
    return "stop" if event.finish_reason in ("eos", "stop") else "length"


def _response(kind: str, meta: dict, text: str, final: DoneEvent, prompt_tokens: int) -> dict:
    completion_tokens = len(final.tokens)
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
    extension = {**final.stats, "token_ids": list(final.tokens)}
    return {**meta, "object": obj, "choices": [choice], "usage": usage, "asyncspec": extension}


async def _sse(
    stream: AsyncIterator[EdgeEvent], tokenizer, meta: dict, kind: str, stops: StopStrings
) -> AsyncIterator[str]:
    text, cut = IncrementalText(tokenizer), StreamedCut(stops)
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
        if isinstance(event, TokenEvent):
            piece = cut.add(text.add(event.token))
            if piece:
                yield chunk(piece, None)
        elif isinstance(event, DoneEvent):
            rest = cut.finish()
            if rest:
                yield chunk(rest, None)
            yield chunk(None, _finish_reason(event))
        else:
            yield f"data: {json.dumps({'error': {'message': event.message}})}\n\n"
    yield "data: [DONE]\n\n"
