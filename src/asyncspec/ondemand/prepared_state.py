"""The target's state for the latest window, prepared in the background as blocks arrive.

For Whisper the state is the encoder output of the window (padded to 30 s as Whisper expects) and
the decoder's KV after the transcription prompt, which holds the cross-attention keys/values of the
whole window. A request copies the self-attention part (a few tokens) and shares the read-only
cross-attention part, so every response starts from exactly the state a fresh prefill would build.
Only the newest prepared window is kept: memory does not grow with the stream.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from asyncspec.models.base import DecodeRequest, DecoderState
from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.ondemand.ingest import AudioBlock, LatestWindow

# openai-whisper's default output length per 30 s window (n_text_ctx // 2): a window on which the
# decoder starts looping stops there, as in the reference implementation, not at 448 positions.
WHISPER_SAMPLE_LEN = 224


@dataclass(frozen=True)
class PreparedWindow:
    version: int  # blocks received when this window was taken
    end_s: float  # stream time of its last sample
    request: DecodeRequest  # the reference input: prompt + this exact audio
    state: DecoderState  # after the prompt; never decoded from directly (the target.copy_state of it is)
    prepare_s: float  # encoder + prompt prefill time
    ready_at: float  # perf_counter time preparation finished

    @property
    def nbytes(self) -> int:
        encoded = self.state.extras["encoded"]
        return encoded.numel() * encoded.element_size() + self.state.cache.nbytes() + self.request.audio.nbytes


def prepare_window(
    target: WhisperBackend, audio: np.ndarray, version: int, end_s: float, language: str = "en"
) -> PreparedWindow:
    began = time.perf_counter()
    request = target.request(audio, language=language, max_new_tokens=WHISPER_SAMPLE_LEN)
    state = target.prefill(request)  # encoder + the prompt's decoder pass (fills cross-attention KV)
    finished = time.perf_counter()
    return PreparedWindow(version, end_s, request, state, finished - began, finished)


class Preparer:
    """Background thread: after each block, prepares the latest window (unless a newer block has
    already arrived), yielding to requests in progress so it never slows a response down."""

    def __init__(self, target: WhisperBackend, window: LatestWindow, language: str = "en"):
        self.target, self.window, self.language = target, window, language
        self.latest: PreparedWindow | None = None
        self.prepared_windows = 0
        self.skipped_versions = 0  # blocks that arrived while an older window was still being prepared
        self.requests_idle = threading.Event()
        self.requests_idle.set()
        self._changed = threading.Condition()
        self._wanted = 0
        self._closed = False
        self.error: str | None = None  # why the thread died, if it did (requests then fail at once)
        self.thread = threading.Thread(target=self._run, name="prepare", daemon=True)

    def start(self) -> Preparer:
        self.thread.start()
        return self

    def on_block(self, block: AudioBlock) -> None:
        with self._changed:
            self._wanted += 1
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _run(self) -> None:
        try:
            self._prepare_forever()
        except BaseException as error:  # recorded and announced: waiting requests must not sit out their timeout
            with self._changed:
                self.error = f"{type(error).__name__}: {error}"
                self._changed.notify_all()
            raise

    @property
    def alive(self) -> bool:
        return self.error is None and self.thread.is_alive()

    def _prepare_forever(self) -> None:
        torch.set_num_threads(1)
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or self._wanted > self._version())
                if self._closed:
                    return
            self.requests_idle.wait()
            version, end_s, audio = self.window.latest()
            if version <= self._version():
                continue
            prepared = prepare_window(self.target, audio.copy(), version, end_s, self.language)
            with self._changed:
                self.skipped_versions += max(0, version - self._version() - 1)
                self.latest, self.prepared_windows = prepared, self.prepared_windows + 1
                self._changed.notify_all()

    def _version(self) -> int:
        return self.latest.version if self.latest else 0

    def wait_for(self, version: int, timeout: float) -> PreparedWindow | None:
        """The prepared window of at least `version` blocks, waiting up to `timeout` seconds."""
        with self._changed:
            ready = lambda: self._closed or self.error is not None or self._version() >= version  # noqa: E731
            self._changed.wait_for(ready, timeout=timeout)
            return self.latest if self._version() >= version else None
