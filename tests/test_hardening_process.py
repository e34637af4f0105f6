"""The must-show payload against real processes: `serve cloud` and `serve edge --http` with CURVE
between them and an API key on the HTTP API; `temperature: 1e-45` gets an OpenAI 400 and the edge
goes on serving exact completions. `listen` on a busy port exits 2 before loading any model."""

from __future__ import annotations

import socket

import numpy as np
import openai
import pytest
import soundfile

from asyncspec.cloudedge.auth import generate_keys
from cloudedge_support import free_address, free_port, model_pair, save_tiny, spawn, wait_ready

PROMPT = "w3 w17 w5 w8"
API_KEY = "test-key-0123456789abcdef"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    target, drafter = model_pair(noise=0.05, family="qwen3")
    root = tmp_path_factory.mktemp("hardened")
    keys = root / "keys"
    generate_keys(keys, "cloud"), generate_keys(keys, "edge")
    (keys / "edges").mkdir()
    (keys / "edges" / "edge.key").write_bytes((keys / "edge.key").read_bytes())
    (root / "api.key").write_text(API_KEY + "\n")
    return save_tiny(target, root / "target"), save_tiny(drafter, root / "drafter"), keys, root / "api.key"


def reference(model_dir, text: str, max_new_tokens: int) -> str:
    from asyncspec.decoding.target_only import decode_target_only
    from asyncspec.models.registry import load_decoder

    target = load_decoder(str(model_dir), "fp32")
    return target.tokenizer.decode(decode_target_only(target, None, target.request(text, max_new_tokens)).tokens)


def stop(process) -> str:
    process.terminate()
    _, err = process.communicate(timeout=30)
    return err


def test_temperature_1e_45_is_a_400_and_the_hardened_edge_goes_on(dirs):
    target_dir, drafter_dir, keys, api_key = dirs
    cloud_address, edge_address, port = free_address(), free_address(), free_port()
    cloud = spawn("serve", "cloud", "--model", str(target_dir), "--bind", cloud_address, "--dtype", "fp32",
                  "--curve-secret", str(keys / "cloud.key_secret"), "--curve-clients", str(keys / "edges"))  # fmt: skip
    edge = spawn("serve", "edge", "--model", str(drafter_dir), "--cloud", cloud_address, "--bind", edge_address,
                 "--http", f"127.0.0.1:{port}", "--dtype", "fp32", "--curve-secret", str(keys / "edge.key_secret"),
                 "--curve-server", str(keys / "cloud.key"), "--api-key-file", str(api_key))  # fmt: skip
    try:
        assert "CURVE" in wait_ready(cloud)
        wait_ready(edge)
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY, max_retries=0)
        with pytest.raises(openai.BadRequestError, match="temperature"):
            api.completions.create(model="tiny", prompt="def f(x):", max_tokens=4, temperature=1e-45)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong-key-0123456789", max_retries=0
                          ).completions.create(model="tiny", prompt=PROMPT, max_tokens=4)  # fmt: skip
        completion = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0)
        expected = reference(target_dir, PROMPT, 16)
        assert completion.choices[0].text == expected
        curve = ["--curve-secret", str(keys / "cloud.key_secret"), "--curve-server", str(keys / "edge.key")]
        client = spawn("client", "--edge", edge_address, "--prompt", PROMPT, "--max-new-tokens", "16", *curve)
        out, err = client.communicate(timeout=120)
        assert client.returncode == 0 and out.strip() == expected, err  # the client socket speaks CURVE too
    finally:
        edge_log, cloud_log = stop(edge), stop(cloud)
    assert "Traceback" not in edge_log and "Traceback" not in cloud_log


def test_listen_on_a_busy_port_exits_2_before_loading_models(tmp_path):
    audio = tmp_path / "a.wav"
    soundfile.write(audio, (0.3 * np.sin(np.arange(16_000) / 5)).astype(np.float32), 16_000)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        process = spawn("listen", "--audio", str(audio), "--port", str(port), "--model", "no-such-model")
        _, err = process.communicate(timeout=120)
    assert process.returncode == 2 and f"cannot serve HTTP on 127.0.0.1:{port}" in err
