"""As²d when its producer fails: a request whose producer errors or dies is decoded on by the target
alone (still exactly target-only), the failure is counted, the worker is restarted for the next
request; a 10-sample input no longer kills the producer (issue 15's second must-show payload)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import soundfile
import torch

from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.models.offline import ct2_model_dir
from asyncspec.ondevice.buffer import CandidateBuffer, PublishedBatch
from asyncspec.ondevice.messages import Close, Ready, Start, Stop
from asyncspec.ondevice.producer import ProducerProcess, ProducerSpec
from conftest import synthetic_speech, tiny_whisper


@pytest.fixture(scope="module")
def target():
    return tiny_whisper(torch.float32, seed=0, multilingual=True)


@pytest.fixture(scope="module")
def producer(target):
    spec = ProducerSpec(
        kind="ct2-chunk",
        model_dir=str(ct2_model_dir("whisper-tiny.en")),
        target_tokenizer_json=target.tokenizer.backend.to_str(),
    )
    process = ProducerProcess(spec)
    yield process
    process.close()


def decode_both(target, producer, audio):
    request = target.request(audio, max_new_tokens=20)
    truth = METHODS["target"](target, None, request, DecodeConfig()).tokens
    return METHODS["as2d"](target, producer, request, DecodeConfig()), truth


class KilledAfterStart:
    """The real producer, whose worker is killed right after it starts drafting a request."""

    def __init__(self, producer: ProducerProcess):
        self.producer = producer

    def start(self, audio):
        buffer = self.producer.start(audio)
        self.producer.process.kill()
        self.producer.process.join(5)
        return buffer

    def finish(self, buffer):
        self.producer.finish(buffer)


def test_a_ten_sample_chunk_is_decoded_exactly_without_a_producer_failure(target, producer):
    """The producer pads chunks shorter than Whisper's STFT (a file's last chunk can be a few samples)."""
    result, truth = decode_both(target, producer, (0.3 * np.sin(np.arange(10))).astype(np.float32))
    assert result.tokens == truth
    assert result.stats.as2d.producer_failure is None
    assert producer.process.is_alive()


def _worker_thread(monkeypatch, source):
    """worker_main in a thread (so a scripted source can be patched in), loaded: (thread, commands, batches)."""
    import multiprocessing
    import threading

    from asyncspec.ondevice import producer as producer_module

    monkeypatch.setitem(producer_module.SOURCES, "scripted", source)
    command_out, command_in = multiprocessing.Pipe(duplex=False)
    batch_out, batch_in = multiprocessing.Pipe(duplex=False)
    worker = threading.Thread(
        target=producer_module.worker_main, args=(ProducerSpec(kind="scripted"), command_out, batch_in)
    )
    worker.start()
    assert isinstance(batch_out.recv(), Ready)
    return worker, command_in, batch_out


class FailingOnOddRequests:
    """A source that raises on every odd request id and publishes one token otherwise."""

    def __init__(self, spec):
        self.spec = spec

    def run(self, request_id, audio, publish, should_stop):
        if request_id % 2:
            raise RuntimeError(f"the source broke on request {request_id}")
        publish(PublishedBatch(request_id, "test", 0, (7,), None, 0.0, 0.0))


def test_a_source_error_fails_only_that_request_and_the_worker_serves_on(monkeypatch):
    """worker_main (run in a thread here, so the failing source can be patched in) reports the error
    for its request and serves the next one."""
    worker, command_in, batch_out = _worker_thread(monkeypatch, FailingOnOddRequests)
    buffers = []
    for request_id in (1, 2):
        buffer = CandidateBuffer(request_id, batch_out)
        command_in.send(Start(request_id, np.zeros(10, np.float32)))
        while not buffer.finished:
            buffer.accept(batch_out.recv())
        buffers.append(buffer)
    command_in.send(Close())
    worker.join(10)
    assert "broke on request 1" in buffers[0].failure and buffers[0].tokens == []
    assert buffers[1].failure is None and buffers[1].tokens == [7]


def test_a_worker_killed_mid_request_falls_back_to_target_only_and_is_restarted(target, producer):
    failures, restarts = producer.failures, producer.restarts
    result, truth = decode_both(target, KilledAfterStart(producer), synthetic_speech(2.0, seed=1))
    assert result.tokens == truth
    assert "died" in result.stats.as2d.producer_failure
    assert producer.failures == failures + 1
    result, truth = decode_both(target, producer, synthetic_speech(2.0, seed=2))
    assert result.tokens == truth and result.stats.as2d.producer_failure is None
    assert producer.restarts == restarts + 1 and producer.process.is_alive()


def test_transcribe_a_ten_sample_file_with_as2d_is_a_clear_input_error(tmp_path):
    """The must-show payload through the CLI: no traceback, `asyncspec: error: ...`, exit 2 (the input
    is validated before any model loads; the producer itself now also survives such a chunk, above)."""
    from cloudedge_support import spawn

    path = tmp_path / "tiny.wav"
    soundfile.write(path, (0.3 * np.sin(np.arange(10))).astype(np.float32), 16_000)
    process = spawn("transcribe", str(path), "--method", "as2d", "--model", "whisper-tiny.en", "--dtype", "fp32")
    _, err = process.communicate(timeout=240)
    assert process.returncode == 2 and "Traceback" not in err
    assert "asyncspec: error:" in err and "too short to transcribe" in err


class PublishingOnce:
    """A source that publishes its request's id as one token, after a short pause."""

    def __init__(self, spec):
        self.spec = spec

    def run(self, request_id, audio, publish, should_stop):
        time.sleep(0.05)
        if not should_stop():
            publish(PublishedBatch(request_id, "test", 0, (request_id,), None, 0.0, 0.0))


def test_the_worker_runs_ahead_through_arrived_requests_and_skips_a_stopped_one(monkeypatch):
    """Starts queue in arrival order and are drafted back to back; a request stopped before its turn
    is reported done unread; the demux hands each request only its own messages."""
    from asyncspec.ondevice.producer import _Demux

    worker, commands, batches = _worker_thread(monkeypatch, PublishingOnce)
    demux = _Demux(batches)
    buffers = {i: CandidateBuffer(i, demux.channel(i)) for i in (1, 2, 3)}
    for i in (1, 2, 3):
        commands.send(Start(i, np.zeros(10, np.float32)))
    commands.send(Stop(2))  # 2 ends before its drafting begins
    deadline = time.monotonic() + 10
    while not all(b.finished for b in buffers.values()) and time.monotonic() < deadline:
        for buffer in reversed(buffers.values()):  # drained in any order: routing keeps them apart
            buffer.refresh()
    commands.send(Close())
    worker.join(10)
    assert [b.tokens for b in buffers.values()] == [[1], [], [3]]
    assert buffers[2].producer_log == [] and all(b.failure is None for b in buffers.values())


def test_arrived_requests_are_drafted_ahead_and_decoded_exactly(target, producer):
    """`arrive` queues later requests' drafting; each decode then takes its already filling buffer."""
    audios = [synthetic_speech(1.5, seed=s) for s in (3, 4, 5)]
    requests = [target.request(audio, max_new_tokens=12) for audio in audios]
    producer.arrive([r.audio for r in requests])
    for request in requests:
        truth = METHODS["target"](target, None, request, DecodeConfig()).tokens
        result = METHODS["as2d"](target, producer, request, DecodeConfig())
        assert result.tokens == truth
        assert result.stats.as2d.producer_failure is None
        assert result.stats.as2d.producer_messages_before_end == 0
    assert producer._arrived == {}


def test_the_worker_returns_quietly_when_its_parent_closes_the_pipes(monkeypatch):
    """A parent that goes away closes its pipe ends: the worker's recv raises EOFError, which used
    to end it with a traceback; now worker_main returns."""
    import threading

    errors: list = []
    monkeypatch.setattr(threading, "excepthook", lambda hook: errors.append(hook.exc_type))
    worker, commands, batches = _worker_thread(monkeypatch, FailingOnOddRequests)
    commands.close()  # the parent is gone
    worker.join(10)
    assert not worker.is_alive() and errors == []


def _scripted_worker(commands, batches) -> None:
    """A spawned worker process with the scripted source (registered in the child itself)."""
    from asyncspec.ondevice import producer as producer_module

    producer_module.SOURCES["scripted"] = FailingOnOddRequests
    producer_module.worker_main(ProducerSpec(kind="scripted"), commands, batches)


def test_a_worker_process_whose_parent_goes_exits_0_without_a_traceback(capfd):
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    command_out, command_in = context.Pipe(duplex=False)
    batch_out, batch_in = context.Pipe(duplex=False)
    process = context.Process(target=_scripted_worker, args=(command_out, batch_in))
    process.start()
    command_out.close(), batch_in.close()  # only the child holds these ends now, as with a real parent
    assert batch_out.poll(60) and isinstance(batch_out.recv(), Ready)
    command_in.close(), batch_out.close()  # the parent's ends go, as when the parent dies
    process.join(30)
    assert process.exitcode == 0
    assert "Traceback" not in capfd.readouterr().err
