"""`stop`, the penalties and `user` through the real processes (`asyncspec serve cloud|edge`) and the
official openai client, greedy: the tokens equal target-only's with the same fields, computed
independently of the engine and of shaping.py / stop_strings.py (transformers' forward with the
penalties written out below; the stop found by searching each prefix's text)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from asyncspec.cloudedge import protocol as wire
from cloudedge_support import spawn_cloud_and_edge, stop_process, wait_ready
from test_cloudedge_process import PROMPT, pair_dirs

assert pair_dirs  # the fixture: a tiny Qwen3 target and drafter saved as model directories

PRESENCE, FREQUENCY = wire.f32(0.4), wire.f32(0.7)


def reference_tokens(model_dir, prompt: str, max_new_tokens: int, presence=0.0, frequency=0.0) -> list[int]:
    """Greedy with OpenAI's penalties over transformers' own forward of the saved model (fp32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(model_dir).encode(prompt)
    eos, output = model.generation_config.eos_token_id, []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids + output])).logits[0, -1].double()
            for token, count in Counter(output).items():
                logits[token] -= frequency * count + presence
            token = int(logits.argmax())
            if token == eos:
                break
            output.append(token)
    return output


def first_stop(tokens: list[int], decode, stop: str) -> tuple[list[int], str] | None:
    """The tokens up to the first whose text holds `stop`, and the text before it (None: never)."""
    for end in range(1, len(tokens) + 1):
        text = decode(tokens[:end])
        if stop in text:
            return tokens[:end], text[: text.index(stop)]
    return None


@pytest.fixture(scope="module")
def services(pair_dirs):
    from openai import OpenAI

    _, _, target_dir, drafter_dir = pair_dirs
    cloud, edge, port = spawn_cloud_and_edge(target_dir, drafter_dir, "--block-size", "5")
    try:
        assert "ready" in wait_ready(cloud) and "ready" in wait_ready(edge)
        yield OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused"), target_dir
    finally:
        edge_rc, edge_log = stop_process(edge)
        cloud_rc, cloud_log = stop_process(cloud)
        assert edge_rc == 0 and cloud_rc == 0, edge_log + cloud_log


def token_ids(completion) -> list[int]:
    return completion.model_extra["asyncspec"]["token_ids"]


def test_greedy_penalties_equal_target_only_with_the_same_penalties(services):
    api, target_dir = services
    fields = dict(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0, user="tester")
    penalised = api.completions.create(**fields, presence_penalty=0.4, frequency_penalty=0.7)
    plain = api.completions.create(**fields)
    expected = reference_tokens(target_dir, PROMPT, 40, PRESENCE, FREQUENCY)
    assert token_ids(penalised) == expected
    assert token_ids(plain) == reference_tokens(target_dir, PROMPT, 40)
    assert token_ids(penalised) != token_ids(plain)  # the control: the penalties change this output


def test_stop_cuts_where_target_only_first_holds_it(services):
    from asyncspec.models.registry import load_decoder

    api, target_dir = services
    decode = load_decoder(str(target_dir), "fp32").tokenizer.decode  # the text the edge serves
    full = reference_tokens(target_dir, PROMPT, 40)
    words = decode(full).split()
    stop = f" {words[6]} {words[7]}"  # a two-word stop string some way into the output
    expected_tokens, expected_text = first_stop(full, decode, stop)
    assert len(expected_tokens) < len(full)
    fields = dict(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0)
    stopped = api.completions.create(**fields, stop=[stop, "never said"])
    assert stopped.choices[0].text == expected_text and stop not in stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop"
    assert token_ids(stopped) == expected_tokens  # the cloud closed the request at the cut
    chunks = list(api.completions.create(**fields, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected_text
    assert chunks[-1].choices[0].finish_reason == "stop"
    unstopped = api.completions.create(**fields, stop="never said")
    assert unstopped.choices[0].finish_reason == "length" and token_ids(unstopped) == full


def test_an_unsupported_field_keeps_its_clear_400(services):
    from openai import BadRequestError

    api, _ = services
    with pytest.raises(BadRequestError) as refused:
        api.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, logit_bias={"3": 5})
    assert "logit_bias" in str(refused.value)


def reference_laws(model_dir, prompt: str, output: list[int], temperature: float) -> torch.Tensor:
    """log of the law each output token was decided from, by transformers' forward (fp32 logits,
    float64 arithmetic): log_softmax when greedy, log softmax(logits / T) when sampled (no top_p here)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(model_dir).encode(prompt)
    with torch.no_grad():
        logits = model(torch.tensor([ids + output])).logits[0, len(ids) - 1 : len(ids) - 1 + len(output)].double()
    return torch.log_softmax(logits / (temperature or 1.0), dim=-1)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_are_the_targets_and_cost_only_when_asked(services, temperature):
    api, target_dir = services
    fields = dict(model="tiny", prompt=PROMPT, max_tokens=30, temperature=temperature, seed=11)
    asked = api.completions.create(**fields, logprobs=3)
    plain = api.completions.create(**fields)
    tokens = token_ids(asked)
    assert tokens == token_ids(plain)  # asking changes no token
    laws = reference_laws(target_dir, PROMPT, tokens, temperature)
    got = torch.tensor(asked.choices[0].logprobs.token_logprobs, dtype=torch.float64)
    expected = laws[torch.arange(len(tokens)), torch.tensor(tokens)]
    assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()
    if temperature:  # the control: the untempered law's values, which a cloud ignoring T would send, differ
        untempered = reference_laws(target_dir, PROMPT, tokens, 0.0)[torch.arange(len(tokens)), torch.tensor(tokens)]
        assert not torch.allclose(got, untempered, atol=1e-2)
    for row, alternatives in zip(laws, asked.choices[0].logprobs.top_logprobs, strict=True):
        assert sorted(alternatives.values(), reverse=True) == pytest.approx(row.topk(3).values.tolist(), abs=1e-4)
    assert len(tokens) >= 5
    stats, plain_stats = asked.model_extra["asyncspec"], plain.model_extra["asyncspec"]
    extra = stats["downlink_bytes"] - plain_stats["downlink_bytes"]
    uplink = stats["uplink_bytes"] - plain_stats["uplink_bytes"]
    print(f"T={temperature}, logprobs=3: +{uplink} B up, +{extra} B down over {len(tokens)} tokens")
    print(f"  corrections: {stats['corrections']}")
    # the Open's field, sent with the default shaping fields before it (three msgpack floats)
    assert uplink <= 4 * 9
    assert extra > 0 and plain.choices[0].logprobs is None


def test_chat_logprobs_in_openais_shape(services):
    api, _ = services
    chat = api.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "w1 w2"}], max_tokens=6, temperature=0,
        logprobs=True, top_logprobs=2,
    )  # fmt: skip
    content = chat.choices[0].logprobs.content
    assert "".join(entry.token for entry in content).replace(" ", "") == chat.choices[0].message.content.replace(
        " ", ""
    )
    assert all(len(entry.top_logprobs) == 2 and entry.logprob == entry.top_logprobs[0].logprob for entry in content)
