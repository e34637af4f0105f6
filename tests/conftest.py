"""Shared fixtures: tiny randomly initialised models built from configs (no download) and the
real offline models, prepared once per session into the user's cache."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import tokenizers
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    WhisperConfig,
    WhisperForConditionalGeneration,
)

from asyncspec.models.hf_causal import CausalLMBackend
from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.models.machine import cpu_identity
from asyncspec.models.offline import REGISTRY, is_installed, is_prepared, model_dir
from asyncspec.models.tokenizer import TextTokenizer

TINY_VOCAB = 96

# No test (nor a CLI it spawns) may pick up a deployed configuration selected on this machine.
os.environ["ASYNCSPEC_CONFIG"] = os.path.join(tempfile.mkdtemp(prefix="asyncspec-test-"), "as2d.json")


def word_tokenizer(vocab: int = TINY_VOCAB) -> TextTokenizer:
    """A word-level tokenizer over 'w0'..'wN' plus an end-of-text token (id vocab-1)."""
    words = {f"w{i}": i for i in range(vocab - 1)} | {"<eos>": vocab - 1}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="w0"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(["<eos>"])
    return TextTokenizer(backend)


CAUSAL_LAYOUTS = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),  # per-head q/k RMSNorm, an explicit head_dim
    "llama": (LlamaConfig, LlamaForCausalLM),  # no q/k/v biases
}


def tiny_causal(
    dtype: torch.dtype | str = torch.float32,
    seed: int = 0,
    engine: str = "fixed-shape",
    layout: str = "qwen2",
    init_std: float = 0.02,
) -> CausalLMBackend:
    """dtype "int8": an fp32 model with int8 decoder weights (models/int8_linear.py); init_std: the
    weights' spread (transformers' 0.02 gives logits that barely depend on the input)."""
    torch.manual_seed(seed)
    config_class, model_class = CAUSAL_LAYOUTS[layout]
    config = config_class(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        initializer_range=init_std,
    )
    model = model_class(config).to(torch.float32 if dtype == "int8" else dtype)
    eos = frozenset({TINY_VOCAB - 1})
    name = f"tiny-{layout}-{seed}"
    return CausalLMBackend(model, word_tokenizer(), name, eos, engine=engine, int8=dtype == "int8")


def tiny_whisper(
    dtype: torch.dtype | str = torch.float32,
    seed: int = 0,
    multilingual: bool = False,
    engine: str = "fixed-shape",
    peak: float = 1.0,
) -> WhisperBackend:
    """Whisper-shaped, 2+2 layers, with the real tiny.en (English-only) or base (multilingual) tokenizer;
    dtype "int8": an fp32 model with int8 decoder weights. `peak` scales the (tied) token embedding,
    so the logits: a random model's near-uniform distributions become peaked, like a trained one's."""
    torch.manual_seed(seed)
    eot = 50257 if multilingual else 50256
    config = WhisperConfig(
        vocab_size=51865 if multilingual else 51864,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_mel_bins=80,
        max_source_positions=1500,
        max_target_positions=448,
        eos_token_id=eot,
        pad_token_id=eot,
        bos_token_id=eot,
        decoder_start_token_id=eot + 1,
        suppress_tokens=[1, 2, 7],
        begin_suppress_tokens=[220, eot],
    )
    model = WhisperForConditionalGeneration(config).to(torch.float32 if dtype == "int8" else dtype)
    with torch.no_grad():
        model.model.decoder.embed_tokens.weight.mul_(peak)
    source = "whisper-base" if multilingual else "whisper-tiny.en"
    tokenizer = TextTokenizer.from_file(real_model_dir(source) / "tokenizer.json")
    return WhisperBackend(model, tokenizer, f"tiny-whisper-{seed}", engine=engine, int8=dtype == "int8")


def real_model_dir(name: str):
    from asyncspec.models.offline import prepare

    return prepare(name, log=lambda _: None)


def synthetic_speech(seconds: float = 3.0, seed: int = 0) -> np.ndarray:
    """Voiced noise: enough for shape and numerics tests of the encoder path."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16_000)) / 16_000
    return (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + rng.standard_normal(t.size) * 0.1)).astype(np.float32)


def qwen_available(name: str) -> bool:
    """The Qwen tests run whenever the extra is installed (they prepare it) or already prepared."""
    return is_prepared(name) or is_installed(REGISTRY[name])


requires_qwen_05b = pytest.mark.skipif(
    not qwen_available("qwen2.5-coder-0.5b"), reason="Qwen extra not installed (make qwen)"
)
requires_qwen_pair = pytest.mark.skipif(
    not (qwen_available("qwen2.5-coder-0.5b") and qwen_available("qwen2.5-coder-1.5b")),
    reason="Qwen extra not installed (make qwen)",
)

__all__ = [
    "model_dir",
    "requires_qwen_05b",
    "requires_qwen_pair",
    "synthetic_speech",
    "tiny_causal",
    "tiny_whisper",
    "word_tokenizer",
]


# bf16 products in hardware (avx512_bf16 or AMX). Elsewhere oneDNN converts, and wide calls pay
# most: measured on an AVX2-only Zen 3 EPYC (2026-12-03), one 64-row linear at Qwen 1.5B's MLP
# shape took 185 ms in bf16 against 39 ms in fp32 (27 against 18 ms at 8 rows).
CPU_FLAGS = set(cpu_identity().replace("|", " ").split())
NATIVE_BF16 = bool({"avx512_bf16", "amx_bf16"} & CPU_FLAGS)


# The real models' exactness tests (Whisper base, the Qwen pair) hold in any dtype; they run in
# bf16 where the CPU has it and in fp32 elsewhere, as `--dtype auto` would choose (on the Zen 3
# EPYC, bf16 made the Qwen services test alone take over ten minutes, and Whisper base's encoder
# costs ~3x fp32's). bf16 on real models is still checked there by test_independent_reference
# (0.5B's bf16 logits against transformers' fp32), and on the tiny models.
REAL_DTYPE = "bf16" if NATIVE_BF16 else "fp32"
# A real model's bf16 variant of a test: on a CPU that emulates bf16 it costs minutes (the
# LibriVox exactness test ran ~5 min there against 64 s on the AVX-512 EPYC), and asyncspec would
# not choose bf16 there (`--dtype auto` measured fp32 fastest). bf16 on such a CPU stays checked on
# the tiny models and by the self-test at every load.
BF16_REAL = pytest.param(
    "bf16", marks=pytest.mark.skipif(not NATIVE_BF16, reason="real-model bf16 runs where the CPU has native bf16")
)
# int8 products in hardware (VNNI). Without it torch's integer matmul has no fast path: one call's
# linears cost 6x fp32's on the AVX2 Zen 3 (`--dtype auto`'s timing), and the real Qwen 0.5B batch
# check alone took 249 s. There the real-model int8 variants are skipped: this CPU is then the AVX2
# case that test_int8_capped_isa runs anyway (the self-test on real Whisper tiny.en and the
# stacked-request batch check on real Qwen 0.5B, both in int8), and test_int8 keeps every tiny one.
NATIVE_INT8 = bool({"avx512_vnni", "avx_vnni", "amx_int8"} & CPU_FLAGS)
INT8_REAL = pytest.param(
    "int8", marks=pytest.mark.skipif(not NATIVE_INT8, reason="real-model int8 runs where the CPU has VNNI")
)


@pytest.fixture(scope="session")
def whisper_base():
    from asyncspec.models.registry import load_decoder

    return load_decoder("whisper-base", REAL_DTYPE)


@pytest.fixture(scope="module")
def producer(whisper_base):
    """As²d's real producer process (CTranslate2 tiny.en), publishing in Whisper base's tokens."""
    from asyncspec.models.offline import ct2_model_dir
    from asyncspec.ondevice.producer import ProducerProcess, ProducerSpec

    spec = ProducerSpec(
        model_dir=str(ct2_model_dir("whisper-tiny.en")),
        target_tokenizer_json=whisper_base.tokenizer.backend.to_str(),
    )
    process = ProducerProcess(spec)
    yield process
    process.close()


@pytest.fixture(scope="session")
def qwen_15b():
    """The real target in REAL_DTYPE, loaded once per run: each load reads 3.5 GB, and on this
    project's VMs the page cache keeps ~5 GB, so a second load read the disk again (~30 s at 120
    MB/s). A test that spawns a 1.5B service after taking this fixture finds the file's pages still
    cached."""
    from asyncspec.models.registry import load_decoder

    return load_decoder("qwen2.5-coder-1.5b", REAL_DTYPE)


@pytest.fixture(scope="session")
def qwen_05b_fp32():
    """Qwen 0.5B on the fp32 engine, its `.model` transformers' own (the reference), loaded once."""
    from asyncspec.models.offline import prepare
    from asyncspec.models.registry import load_decoder

    prepare("qwen2.5-coder-0.5b")
    return load_decoder("qwen2.5-coder-0.5b", "fp32")


# `make test` runs two pytest-xdist workers (--dist loadfile). Tests are dealt out a module at a
# time, so that a module's fixtures (live services, loaded models) are made once; the modules that
# share a session-scoped large model go to one worker, which loads it once (two Qwen 1.5B copies,
# plus the services test's own cloud, would not fit in memory beside a second `make test`).
SHARED_MODEL_GROUPS = {
    "qwen-1.5b": ("test_cloudedge_qwen", "test_speculative"),
    "qwen-0.5b-fp32": ("test_fixed_shape", "test_independent_reference", "test_int8_capped_isa"),
}
MODULE_GROUP = {module: group for group, modules in SHARED_MODEL_GROUPS.items() for module in modules}


def pytest_xdist_make_scheduler(config, log):
    """loadfile's scheduler with the groups above, the longest first. (xdist's own `xdist_group`
    marks do nothing under pytest 9.2: xdist writes the group into `item._nodeid`, which pytest no
    longer reads, and every test was dealt alone: the Ray scenarios ran on both workers at once.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
            return MODULE_GROUP.get(module, module)

        def _assign_work_unit(self, node) -> None:
            longest_first(self.workqueue)
            super()._assign_work_unit(node)

    return ModuleGroups(config, log)


# Seconds each scope took in one worker of `make test` (--durations per module, 2-core EPYC with
# avx512_bf16, 2026-12-04). Only the order matters: xdist deals work in its queue's order, and by
# default that is the number of tests, so the largest groups (a few slow tests each) came last: on
# the AVX2 Zen 3 one worker ran them alone for the last 15 of 27 minutes. Longest first evens the
# two workers' ends (the classic LPT rule).
# A scope not listed (under 10 s then, or new) counts 2 s per test.
SCOPE_SECONDS = {
    "qwen-0.5b-fp32": 271,
    "qwen-1.5b": 185,
    "test_adversarial": 161,
    "test_sampling_fidelity": 135,
    "test_longform_real": 115,
    "test_cli": 108,
    "test_exact_librivox": 104,
    "test_cloudedge_replicas": 87,
    "test_ondemand_real": 70,
    "test_as2d": 58,
    "test_cloudedge_baselines": 42,
    "test_bench_e2e": 34,
    "test_ggml_whisper": 33,
    "test_openai_fields": 32,
    "test_cloudedge_services": 28,
    "test_cloudedge_batching": 28,
    "test_word_timestamps_real": 27,
    "test_cloudedge_process": 27,
    "test_edge_fidelity": 24,
    "test_ct2_converter": 24,
    "test_cloudedge_exactness": 19,
    "test_whisper_model": 18,
    "test_command_success": 16,
    "test_hardening_connections": 16,
    "test_hardening_memory": 14,
    "test_verify": 14,
    "test_backends": 14,
    "test_hardening_process": 13,
    "test_link": 13,
    "test_exactness": 13,
    "test_ondemand_service": 13,
    "test_sandbox": 13,
    "test_longform_set": 30,
    "test_bench_cloud": 12,
    "test_hardening_auth": 11,
    "test_decoupling": 11,
    "test_hardening_offloopback": 10,
}


def longest_first(workqueue) -> None:
    """Reorders xdist's queue of scopes ({scope: {nodeid: done}}) by expected seconds, longest first."""
    order = sorted(workqueue.items(), key=lambda item: -SCOPE_SECONDS.get(item[0], 2.0 * len(item[1])))
    if [scope for scope, _ in order] != list(workqueue):
        workqueue.clear()
        workqueue.update(order)


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)  # one core per worker: two workers on two cores, not four threads
