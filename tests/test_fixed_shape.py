"""The fixed-shape engine: a row's logits and KV are bitwise independent of the call that computed
them (random partitions of a sequence into calls, rollbacks between them), the invariance self-test
passes on it, and fails on a deliberately shape-dependent engine, whose speculative use is refused."""

from __future__ import annotations

import random

import pytest
import torch

from asyncspec.cloudedge.cloud import CloudVerifier
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.errors import InputError
from asyncspec.models.base import DecodeRequest
from asyncspec.models.row_probe import kv_rows, probe_tokens
from asyncspec.models.selftest import check_invariance, invariance, partitions
from asyncspec.models.threads import torch_threads
from conftest import BF16_REAL, INT8_REAL, requires_qwen_05b, synthetic_speech, tiny_causal, tiny_whisper


def random_partition(rng: random.Random, n: int, widest: int) -> list[int]:
    sizes = []
    while sum(sizes) < n:
        sizes.append(min(rng.randint(1, widest), n - sum(sizes)))
    return sizes


def assert_partitions_bitwise_equal(decoder, request, tokens, trials: int, seed: int = 0):
    """One-token calls vs random partitions (with a rolled-back detour): logits and KV bitwise."""
    rng = random.Random(seed)
    reference_state = decoder.prefill(request)
    reference = torch.cat([decoder.extend(reference_state, [t]) for t in tokens])
    for _ in range(trials):
        state = decoder.prefill(request)
        detour = rng.randint(1, 12)
        decoder.extend(state, [(t + 3) % decoder.vocab_size for t in tokens[:detour]])
        decoder.rollback(state, len(request.prompt_ids))
        rows, done = [], 0
        for size in random_partition(rng, len(tokens), widest=2 * decoder.call_width + 1):
            rows.append(decoder.extend(state, tokens[done : done + size]))
            done += size
        logits = torch.cat(rows)
        differing = [i for i in range(len(tokens)) if not torch.equal(logits[i], reference[i])]
        assert not differing, f"rows {differing[:5]} depend on the call that computed them"
        for mine, theirs in zip(kv_rows(state), kv_rows(reference_state), strict=True):
            assert torch.equal(mine, theirs)


class ShapeDependentForward:
    """A deliberately broken engine: it perturbs hidden states by the call's number of real rows,
    as a kernel whose blocking follows the call's shape would (here on every CPU, by construction)."""

    def __init__(self, forward):
        self.inner = forward
        self.hidden_size = forward.hidden_size

    def new_cache(self, slots, context):
        return self.inner.new_cache(slots, context)

    def __call__(self, slots, ids, prompt=False, widths=None):
        return self.inner(slots, ids, prompt, widths) + 1e-2 * len(slots)


def shape_dependent(decoder, forward=ShapeDependentForward):
    decoder.engine.forward = forward(decoder.engine.forward)
    decoder.name += "-shape-dependent"
    return decoder


class OneUlpForward(ShapeDependentForward):
    """The drift the self-test exists for, at its smallest: in a call of more than one real row,
    one element of the last real row moves by one unit in the last place (as a kernel whose
    reduction order follows the call's width would round one sum differently)."""

    def __call__(self, slots, ids, prompt=False, widths=None):
        hidden = self.inner(slots, ids, prompt, widths)
        if len(slots) > 1:
            row = len(slots) - 1
            hidden[row, 0] = torch.nextafter(hidden[row, 0], torch.tensor(float("inf"), dtype=hidden.dtype))
        return hidden


# float engines only: int8's output projection quantizes each row, so one ulp in a hidden state
# rarely reaches the logits at all (a drift that changes no output bit is no difference)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_self_test_catches_one_ulp_in_one_row(dtype):
    for decoder in (tiny_causal(dtype, seed=8), tiny_whisper(dtype, seed=8)):
        assert invariance(decoder, use_cache=False).passed  # the same model, unperturbed
        report = check_invariance(shape_dependent(decoder, OneUlpForward))
        assert not report.passed and 0 < report.rows_differing < report.rows_checked, report.summary()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "int8"])
def test_tiny_models_are_call_invariant_under_random_partitions(dtype):
    causal = tiny_causal(dtype, seed=4)
    generator = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, 90, (70,), generator=generator).tolist()  # two prefill blocks
    tokens = torch.randint(0, 90, (40,), generator=generator).tolist()
    assert_partitions_bitwise_equal(causal, DecodeRequest(tuple(prompt)), tokens, trials=4)
    whisper = tiny_whisper(dtype, seed=4)
    request = whisper.request(synthetic_speech(2.0, seed=4))
    assert_partitions_bitwise_equal(whisper, request, [1000 + 13 * i for i in range(30)], trials=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "int8"])
def test_self_test_passes_on_the_fixed_shape_engine(dtype):
    for decoder in (tiny_causal(dtype, seed=5), tiny_whisper(dtype, seed=5)):
        report = invariance(decoder, use_cache=False)
        assert report.passed, report.summary()
        assert report.rows_checked == 2 * (decoder.call_width + 3) and report.rows_differing == 0


def test_self_test_fails_on_a_shape_dependent_engine_and_speculation_is_refused():
    target = shape_dependent(tiny_causal(torch.float32, seed=6))
    report = check_invariance(target)
    assert not report.passed and report.rows_differing > 0
    assert "differs from one-token calls" in report.first_difference
    target.invariance = report
    drafter = tiny_causal(torch.float32, seed=6, engine="transformers")
    request = DecodeRequest((1, 2, 3), max_new_tokens=8)
    assert len(METHODS["target"](target, None, request, DecodeConfig()).tokens) == 8  # the reference still runs
    for method in ("sd", "specasr"):
        with pytest.raises(InputError, match=f"{method} refused: invariance self-test FAILED"):
            METHODS[method](target, drafter, request, DecodeConfig())
    with pytest.raises(InputError, match="the cloud verifier refused"):
        CloudVerifier(target)


def test_as2d_is_refused_on_a_shape_dependent_whisper_engine():
    target = shape_dependent(tiny_whisper(torch.float32, seed=7))
    target.invariance = check_invariance(target)
    assert not target.invariance.passed

    class IdleProducer:
        def start(self, audio):
            raise AssertionError("the producer must not start for a refused target")

    with pytest.raises(InputError, match="as2d refused"):
        METHODS["as2d"](target, IdleProducer(), target.request(synthetic_speech(1.0)), DecodeConfig())


def _row_blocked(matmul, block: int = 6):
    """A float GEMM run in register blocks of `block` rows, as MKL's AVX2 sgemm is on Intel: rows
    past the last full block take another code path, simulated as the same product summed in the
    opposite order (other rounding)."""

    def blocked(a, b):
        out = matmul(a, b)
        tail = a.shape[-2] - a.shape[-2] % block
        if a.is_floating_point() and tail < a.shape[-2]:
            out[..., tail:, :] = matmul(a[..., tail:, :].flip(-1), b.flip(-2))
        return out

    return blocked


def _attend_all_rows_first(queries, keys, values_t, scale, observe=None, block=None):
    """The control: cross-attention with the call's rows as the products' rows."""
    heads, width, head_dim = queries.shape
    q = queries.to(torch.float32).reshape(keys.shape[0], -1, head_dim)
    weights = torch.softmax(torch.matmul(q, keys.transpose(1, 2)) * scale, dim=-1)
    out = torch.matmul(weights, values_t.transpose(1, 2))
    return out.reshape(heads, width, head_dim).transpose(0, 1).reshape(width, heads * head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, "int8"])
def test_cross_attention_rows_stay_exact_under_a_row_blocked_gemm_kernel(dtype, monkeypatch):
    """Cross-attention is the one float product over a call's rows left in the int8 engine; with the
    rows as columns, a kernel that blocks rows (MKL's 6-row AVX2 kernel, seen on a Xeon capped to
    AVX2) cannot make a row's bits depend on its place in the call."""
    from asyncspec.models import forward_whisper

    monkeypatch.setattr(torch, "matmul", _row_blocked(torch.matmul))
    assert check_invariance(tiny_whisper(dtype, seed=9)).passed
    if dtype == "int8":
        return  # the control in fp32: int8's next linear re-quantizes the row, hiding an ulp in a tiny model
    monkeypatch.setattr(forward_whisper, "attend_all", _attend_all_rows_first)
    report = check_invariance(tiny_whisper(dtype, seed=9))
    assert not report.passed and "row 6 differs" in report.first_difference, report.summary()


def test_self_test_uses_every_row_index_of_a_call():
    width = 8
    full, uneven = partitions(width, width + 3)
    assert full == [width, 3] and sum(uneven) == width + 3 and max(uneven) <= width
    assert len(set(probe_tokens(tiny_causal(), 20))) > 10


@pytest.mark.real
@pytest.mark.parametrize("dtype", [BF16_REAL, "fp32", INT8_REAL])
def test_real_whisper_base_rows_are_call_invariant(dtype):
    from asyncspec.audio import load_audio
    from asyncspec.data.librivox import librivox_clips
    from asyncspec.models.registry import load_decoder

    decoder = load_decoder("whisper-base", dtype)
    assert invariance(decoder, use_cache=False).passed
    request = decoder.request(load_audio(librivox_clips()[1].path))
    tokens = decoder.tokenizer.encode(" He had then leisure to consider what he might do for his sisters, and")
    assert_partitions_bitwise_equal(decoder, request, tokens, trials=3, seed=1)


@pytest.mark.qwen
@requires_qwen_05b
@pytest.mark.parametrize("dtype", [BF16_REAL, "fp32", INT8_REAL])
def test_real_qwen_05b_rows_are_call_invariant(dtype, request):
    from asyncspec.models.offline import prepare
    from asyncspec.models.registry import load_decoder

    prepare("qwen2.5-coder-0.5b")
    if dtype == "fp32":  # the session's shared fp32 load (the reference tests use it too)
        decoder = request.getfixturevalue("qwen_05b_fp32")
    else:
        decoder = load_decoder("qwen2.5-coder-0.5b", dtype)
    assert invariance(decoder, use_cache=False).passed
    request = decoder.request("def is_prime(n: int) -> bool:\n    ")
    tokens = decoder.tokenizer.encode('"""Return True if n is prime."""\n    if n < 2:\n        return False\n')
    assert_partitions_bitwise_equal(decoder, request, tokens, trials=2, seed=2)


class ThreadDependentForward(ShapeDependentForward):
    """A deliberately broken engine whose hidden states follow the thread count (as a kernel that
    splits a reduction across threads would): every call shape agrees at one count, not across two."""

    def __call__(self, slots, ids, prompt=False, widths=None):
        return self.inner(slots, ids, prompt, widths) + 1e-3 * torch.get_num_threads()


def test_self_test_compares_a_second_thread_count_and_catches_a_thread_dependent_engine():
    from asyncspec.transcription.decode_threads import decode_threads

    torch.set_num_threads(1)
    good = tiny_whisper(torch.float32, seed=8)
    report = check_invariance(good, wide_threads=2)
    assert report.passed and report.wide_threads == 2 and report.wide_equal, report.summary()
    assert report.may_use(1) and report.may_use(2) and not report.may_use(3)
    good.invariance = report
    assert decode_threads(good, threads=1, solo_threads=2) == (1, 2)

    bad = tiny_whisper(torch.float32, seed=8)
    bad.engine.forward = ThreadDependentForward(bad.engine.forward)
    report = check_invariance(bad, wide_threads=2)
    assert report.passed and report.wide_equal is False, report.summary()  # equal at one count only
    assert "at 2 threads DIFFERENT" in report.summary() and not report.may_use(2)
    bad.invariance = report
    assert decode_threads(bad, threads=1, solo_threads=2) == (1, 1)  # alone it stays on one thread
    assert torch.get_num_threads() == 1


def test_prefill_projects_only_the_wanted_prompt_rows_and_they_equal_a_full_projection():
    whisper = tiny_whisper(torch.float32, seed=9)
    request = whisper.request(synthetic_speech(1.0, seed=9), previous=list(range(300, 370)))
    prompt = list(request.prompt_ids)
    wanted = [0, 5, len(prompt) - 2, len(prompt) - 1]  # the last one is the first decoding row
    encoded = whisper.encode_audio(request.audio)
    state = whisper._new_state(len(prompt), encoded)
    rows = whisper.prefill_tokens(state, prompt, len(prompt), wanted=wanted)
    assert rows.shape == (len(wanted), whisper.vocab_size) and state.length == len(prompt)
    # every prompt row projected, in 8-row blocks (so close to, not bitwise, the 32-row blocks')
    cache, blocks = whisper.engine.new_cache(encoded), range(0, len(prompt), 8)
    hidden = torch.cat([whisper.engine._block(cache, i, prompt[i : i + 8], 8)[: len(prompt) - i] for i in blocks])
    reference = whisper.project(hidden).float()
    for row, index in zip(rows[:-1], wanted[:-1], strict=True):
        assert torch.allclose(row, reference[index], atol=1e-4), index  # raw: no decision rule applied
    assert torch.equal(rows[-1], state.next_logits)  # the decoding row, with the rules
    with pytest.raises(ValueError, match="not all inside"):
        whisper.engine.prefill(whisper.engine.new_cache(encoded), 0, prompt[:4], wanted=[9])


def test_a_verdict_cached_for_another_engine_revision_is_measured_again(tmp_path, monkeypatch):
    from asyncspec.models import selftest

    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    first = invariance(tiny_causal(torch.float32, seed=12))
    assert not first.cached and len(list((tmp_path / "selftest").glob("*.json"))) == 1
    assert invariance(tiny_causal(torch.float32, seed=12)).cached  # a fresh backend reads the entry
    monkeypatch.setattr(selftest, "VERDICT_REVISION", selftest.VERDICT_REVISION + 1)
    assert not invariance(tiny_causal(torch.float32, seed=12)).cached  # the engine's arithmetic changed


@pytest.mark.parametrize(("one", "two", "alone"), [(0.026, 0.045, 1), (0.026, 0.017, 2), (0.026, 0.0255, 1)])
def test_alone_the_decoder_takes_more_threads_only_where_its_call_is_measured_faster(
    monkeypatch, tmp_path, one, two, alone
):
    from asyncspec.transcription import decode_threads as threads_module

    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))  # a machine of its own: nothing timed yet

    good = tiny_whisper(torch.float32, seed=8)
    before = torch.get_num_threads()
    with torch_threads(1):
        good.invariance = check_invariance(good, wide_threads=2)
    assert good.invariance.may_use(2) and torch.get_num_threads() == before
    monkeypatch.setattr(threads_module, "available_cores", lambda: 2)
    monkeypatch.setattr(threads_module, "call_seconds", lambda target, threads: {1: one, 2: two}[threads])
    assert threads_module.decode_threads(good, threads=None, solo_threads=None) == (1, alone)
    assert threads_module.decode_threads(good, threads=None, solo_threads=2) == (1, 2)  # asked for: not timed


def test_a_decoding_call_is_timed_at_each_thread_count():
    from asyncspec.transcription.decode_threads import call_seconds

    decoder = tiny_whisper(torch.float32, seed=8)
    before = torch.get_num_threads()
    assert 0 < call_seconds(decoder, 1) < 5 and 0 < call_seconds(decoder, 2) < 5
    assert torch.get_num_threads() == before


def test_the_call_timing_is_kept_per_machine_and_openmp_setting(monkeypatch, tmp_path):
    from asyncspec.decoding import draw_plan
    from asyncspec.transcription import decode_threads as threads_module

    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    timed = []

    def timing(engine, cache, position, most_blocks):
        timed.append(torch.get_num_threads())
        return {1: 0.01 * torch.get_num_threads()}

    monkeypatch.setattr(draw_plan, "call_costs", timing)
    decoder = tiny_whisper(torch.float32, seed=8)
    first = threads_module.measured_call_seconds(decoder, (1, 2))
    assert first == {1: 0.01, 2: 0.02} and timed == [1, 2]
    assert threads_module.measured_call_seconds(decoder, (1, 2)) == first and timed == [1, 2]  # read back
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # another OpenMP setting: timed anew
    threads_module.measured_call_seconds(decoder, (1, 2))
    assert timed == [1, 2, 1, 2]


def test_a_stacked_calls_cross_attention_is_each_blocks_own():
    """Blocks stacked into one call attend the encoder output in the products of a one-block call:
    the same bits, and the same weights shown to an observer, as each block alone."""
    from asyncspec.models.fixed_shape import attend_all

    generator = torch.Generator().manual_seed(3)
    heads, head_dim, frames, block = 4, 8, 1500, 8
    keys = torch.randn(heads, frames, head_dim, generator=generator)
    values_t = torch.randn(heads, head_dim, frames, generator=generator)
    queries = torch.randn(heads, 4 * block, head_dim, generator=generator)
    seen: list[torch.Tensor] = []
    stacked = attend_all(queries, keys, values_t, 0.5, seen.append, block=block)
    for at in range(0, 4 * block, block):
        alone_seen: list[torch.Tensor] = []
        alone = attend_all(queries[:, at : at + block].clone(), keys, values_t, 0.5, alone_seen.append)
        assert torch.equal(stacked[at : at + block], alone)
        assert torch.equal(seen[0][:, at : at + block], alone_seen[0])
    assert seen[0].shape == (heads, 4 * block, frames)
