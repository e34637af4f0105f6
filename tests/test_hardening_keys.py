"""API keys at the HTTP front: one per client, read from a file, each holding at most its quota
of requests in flight (the edge's OpenAI API and `listen` share this guard)."""

from __future__ import annotations

import asyncio
import json

import pytest

from asyncspec.errors import InputError
from asyncspec.httpguard import API_KEY_ENV, Guard, GuardConfig, guard_config, load_api_keys

ALICE, BOB = "alice-key-0123456789", "bob-key-0123456789ab"


class HeldApp:
    """An ASGI app that answers 200 once `release` is set: requests stay in flight until then."""

    def __init__(self):
        self.release = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope, receive, send):
        self.entered += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def call(guard: Guard, key: str | None) -> tuple[int, dict]:
    headers = [(b"host", b"127.0.0.1")] + ([(b"authorization", f"Bearer {key}".encode())] if key else [])
    scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": headers}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await guard(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body or b"{}")


async def burst(quota: int) -> dict[str, list[int]]:
    """Three of Alice's requests at once, then one of Bob's and one with no key, while Alice's are
    held; then, released, one more of Alice's."""
    app = HeldApp()
    guard = Guard(app, GuardConfig(api_keys=(ALICE, BOB), max_requests_per_key=quota))
    alice = [asyncio.create_task(call(guard, ALICE)) for _ in range(3)]
    bob = asyncio.create_task(call(guard, BOB))
    stranger = await call(guard, "not-a-key-0123456789")
    await asyncio.sleep(0.05)
    early = [task.result()[0] for task in alice if task.done()]  # refused at once
    app.release.set()
    results = await asyncio.gather(*alice, bob)
    later = await call(guard, ALICE)
    refused = [body for status, body in results if status == 429]
    assert all(body["error"]["type"] == "rate_limit_error" for body in refused)
    assert guard.in_flight == {}  # every place given back
    return {
        "alice": sorted(s for s, _ in results[:3]),
        "early": early,
        "bob": [results[3][0]],
        "stranger": [stranger[0]],
        "later": [later[0]],
    }


def test_a_key_holds_at_most_its_quota_and_other_keys_keep_theirs():
    outcome = asyncio.run(burst(quota=2))
    assert outcome["alice"] == [200, 200, 429] and outcome["early"] == [429]
    assert outcome["bob"] == [200] and outcome["stranger"] == [401] and outcome["later"] == [200]


def test_control_without_a_quota_one_key_takes_every_place():
    outcome = asyncio.run(burst(quota=1_000))
    assert outcome["alice"] == [200, 200, 200] and outcome["early"] == []


def test_keys_are_read_one_per_line_and_weak_or_missing_ones_refused(tmp_path, monkeypatch):
    path = tmp_path / "keys"
    path.write_text(f"# one key per client\n{ALICE}\n\n  {BOB}  \n{ALICE}\n")
    assert load_api_keys(str(path)) == (ALICE, BOB)
    for text in ("", "# only a comment\n", f"{ALICE}\nshort\n"):
        path.write_text(text)
        with pytest.raises(InputError):
            load_api_keys(str(path))
    with pytest.raises(InputError, match="cannot read"):
        load_api_keys(str(tmp_path / "absent"))
    monkeypatch.setenv(API_KEY_ENV, BOB)
    assert load_api_keys(None) == (BOB,)
    monkeypatch.delenv(API_KEY_ENV)
    assert load_api_keys(None) == ()
    with pytest.raises(InputError, match="per API key"):
        guard_config("127.0.0.1", None, 4096, max_requests_per_key=0)
