"""`bench cloudedge` checks every method under every link profile against target-only on full-length
outputs; a mismatch, or a run that could not be checked in full, fails it, and a mismatched run is
left out of every figure. Tiny models."""

from __future__ import annotations

import json

import pytest

from asyncspec.benchmarks import cloudedge
from asyncspec.benchmarks.tiny_pair import save_tiny_pair, tiny_prompts
from asyncspec.cli import EXIT_BAD_INPUT, main
from asyncspec.decoding.target_only import decode_target_only
from asyncspec.models.registry import load_decoder

TOKENS = 6


def config(temperature: float = 0.0) -> cloudedge.BenchConfig:
    return cloudedge.BenchConfig(
        models="tiny", methods=["asymspec", "standard", "runahead"], profiles=["weak"], scales=[1.0],
        workload="humaneval", requests=2, max_new_tokens=TOKENS, temperatures=[temperature], eps_req=0.0,
        clients=None, rate_per_s=None, block_size=7, run_timeout_s=60.0, check_requests=2, check_tokens=TOKENS,
        dtype="fp32", seed=0,
    )  # fmt: skip


def run(method: str, outputs: list[dict], key: str = "outputs", temperature: float = 0.0) -> dict:
    return {"method": method, "profile": "weak", "link_scale": 1.0, "temperature": temperature, key: outputs}


@pytest.mark.parametrize("temperature, key", [(0.0, "outputs"), (0.7, "check_outputs")])
def test_every_run_is_checked_and_a_mismatch_or_a_cut_run_fails(tmp_path, capsys, temperature, key):
    target, _ = save_tiny_pair(tmp_path)
    model = load_decoder(str(target), "fp32")
    prompts = tiny_prompts(2, 0)
    expected = [decode_target_only(model, None, model.request(p, max_new_tokens=TOKENS)).tokens for p in prompts]
    equal = [{"prompt": p, "tokens": list(e), "complete": True} for p, e in zip(prompts, expected, strict=True)]
    flipped = [dict(o, tokens=list(o["tokens"])) for o in equal]
    flipped[1]["tokens"][2] = (flipped[1]["tokens"][2] + 1) % 95
    cut = [equal[0], dict(equal[1], tokens=equal[1]["tokens"][:1], complete=False)]
    results = [run(m, o, key, temperature) for m, o in (("asymspec", equal), ("standard", flipped), ("runahead", cut))]
    exactness = cloudedge.check_exactness(config(temperature), str(target), prompts, results)
    assert [r["exact"] for r in results] == [True, False, None]
    assert exactness.report() == 1
    err = capsys.readouterr().err
    assert (
        "MISMATCH: standard differs from target-only on request 1 under weak at link scale 1 at output token 2" in err
    )
    assert (
        f"NOT CHECKED: runahead under weak at link scale 1 at T {temperature:g}: 1 of 2 requests did not finish" in err
    )
    assert exactness.checked == 5  # the cut request is not compared


def test_sampled_runs_without_greedy_check_requests_are_refused(capsys):
    argv = ["bench", "cloudedge", "--models", "tiny", "--temperature", "0.7", "--check-requests", "0"]
    assert main(argv) == EXIT_BAD_INPUT
    assert "--check-requests" in capsys.readouterr().err


def test_a_sampled_run_whose_greedy_check_differs_fails_and_is_left_out(tmp_path, monkeypatch, capsys):
    """End to end: real cloud, edge and link processes; the first greedy check's output gets one token
    flipped on its way back, as a wrong method would have sent it."""
    real_run_profile = cloudedge.run_profile
    flipped = []

    def run_profile(edge, profile, cloud_port, workload, timeout_s):
        output = real_run_profile(edge, profile, cloud_port, workload, timeout_s)
        if workload.temperature == 0 and not flipped:
            record = output.records[0]
            record.tokens[1] = (record.tokens[1] + 1) % 95
            flipped.append(record.index)
        return output

    monkeypatch.setattr(cloudedge, "run_profile", run_profile)
    argv = [
        "bench", "cloudedge", "--models", "tiny", "--methods", "asymspec,standard", "--profiles", "strong",
        "--link-scales", "1", "--requests", "2", "--max-new-tokens", str(TOKENS), "--temperature", "0.7",
        "--check-requests", "2", "--check-tokens", str(TOKENS), "--out", str(tmp_path),
    ]  # fmt: skip
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert f"MISMATCH: asymspec differs from target-only on request {flipped[0]} under strong" in captured.err
    assert "FAILED: 1 of 4 outputs differ from target-only" in captured.err
    assert "left out of every figure (output differs from target-only): asymspec under strong" in captured.out
    document = json.loads((tmp_path / "cloudedge.json").read_text())
    assert {r["method"]: r["exact"] for r in document["results"]} == {"asymspec": False, "standard": True}
    assert document["exactness"]["mismatches"][0]["position"] == 1
    assert document["comparisons"]["asymspec_vs"]["scale 1"]["strong"] == {"standard": None}  # no asymspec figure
