"""How far the int8 Whisper encoder's output lies from fp32's, beside CTranslate2's int8 encoder
(faster-whisper's) against CTranslate2's float32, on the same log-mel windows.

Both int8 encoders quantize weights per output channel and activations per row (per frame), so
their distance from fp32 should be alike; bf16 is printed for scale. Windows: 30 s at each of
`--starts` seconds into each recording (default: the long-form set's three files).

    ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI MKL_ENABLE_INSTRUCTIONS=AVX512_E1 CT2_FORCE_CPU_ISA=AVX512 \
        .venv/bin/python scripts/int8_encoder_error.py /tmp/wer/longform/*.wav
"""

from __future__ import annotations

import argparse
import copy
import json

import ctranslate2
import numpy as np
import torch

from asyncspec.audio import SAMPLE_RATE, load_audio
from asyncspec.benchmarks.e2e_systems import ct2_directory
from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.models.int8_linear import quantize_linears
from asyncspec.models.log_mel import log_mel_tensor
from asyncspec.models.registry import load_decoder

WINDOW_S = 30


def relative_error(outputs: list[torch.Tensor], references: list[torch.Tensor]) -> float:
    """Mean over windows of ||output - reference|| / ||reference||."""
    return float(
        np.mean([((o.float() - r).norm() / r.norm()).item() for o, r in zip(outputs, references, strict=True)])
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("audio", nargs="+")
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--starts", default="0,60,100", help="window starts, seconds")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    backend = load_decoder(args.model, "fp32", encoder="fp32")
    if not isinstance(backend, WhisperBackend):
        parser.error(f"{args.model} is not a Whisper model")
    encoder = backend.model.model.encoder
    windows = []
    for path in args.audio:
        audio = load_audio(path)
        for start in (int(s) for s in args.starts.split(",")):
            piece = audio[start * SAMPLE_RATE : (start + WINDOW_S) * SAMPLE_RATE]
            windows.append(log_mel_tensor(piece, backend.mel_bins))
    int8 = copy.deepcopy(encoder)
    quantize_linears(int8)
    bf16 = copy.deepcopy(encoder).to(torch.bfloat16)
    with torch.inference_mode():
        fp32_out = [encoder(w).last_hidden_state for w in windows]
        int8_out = [int8(w).last_hidden_state for w in windows]
        bf16_out = [bf16(w.bfloat16()).last_hidden_state for w in windows]

    def ct2_encode(compute_type: str) -> list[torch.Tensor]:
        model = ctranslate2.models.Whisper(
            str(ct2_directory(args.model)), device="cpu", compute_type=compute_type, intra_threads=args.threads
        )
        views = (ctranslate2.StorageView.from_array(w.numpy().astype(np.float32)) for w in windows)
        return [torch.from_numpy(np.array(model.encode(view))).float() for view in views]

    ct2_fp32, ct2_int8 = ct2_encode("float32"), ct2_encode("int8")
    print(
        json.dumps(
            {
                "windows": len(windows),
                "asyncspec int8 vs fp32": round(relative_error(int8_out, fp32_out), 4),
                "ctranslate2 int8 vs float32": round(relative_error(ct2_int8, ct2_fp32), 4),
                "asyncspec bf16 vs fp32": round(relative_error(bf16_out, fp32_out), 4),
                "ctranslate2 float32 vs asyncspec fp32": float(f"{relative_error(ct2_fp32, fp32_out):.2g}"),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
