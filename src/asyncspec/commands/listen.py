"""`asyncspec listen`: ingest a live audio stream and answer transcription requests over HTTP from
the state prepared in the background; with --auto, transcribe every block as it arrives instead."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from asyncspec.audio import load_audio
from asyncspec.commands.serve_options import add_connection_options, add_http_auth_options, connection_limits
from asyncspec.errors import InputError
from asyncspec.ondemand.ingest import PACES, PCM_FORMATS, AudioBlock, LatestWindow, file_blocks, pcm_blocks
from asyncspec.run.options import add_decoding_options

MULTIPART_OVERHEAD_BYTES = 64 << 10  # an upload's body: the file plus its form fields and boundaries
HELP = "serve transcription requests over a live audio stream (or --auto: transcribe every block)"


def add_arguments(parser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--audio", metavar="FILE", help="an audio file fed as a stream (see --pace)")
    source.add_argument("--stdin", action="store_true", help="raw mono 16 kHz PCM on stdin (see --pcm-format)")
    parser.add_argument("--pace", choices=PACES, default="realtime", help="file input: real time or as fast as read")
    parser.add_argument("--pcm-format", choices=list(PCM_FORMATS), default="s16le")
    parser.add_argument("--block-s", type=float, default=4.0, help="seconds of audio per ingested block")
    parser.add_argument("--window-s", type=float, default=30.0, help="latest audio retained and prepared (<= 30)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-queue", type=int, default=4, help="requests waiting beyond this get HTTP 429")
    parser.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="require `Authorization: Bearer KEY`, KEY a line of FILE (one per client; or env ASYNCSPEC_API_KEY)",
    )
    add_http_auth_options(parser)
    parser.add_argument("--max-upload-bytes", type=int, default=32 << 20, help="largest uploaded file")
    parser.add_argument("--max-connections", type=int, default=32, help="concurrent HTTP requests (503 beyond)")
    add_connection_options(parser, "--", body_timeout_s=300.0)  # uploads are up to 32 MiB
    parser.add_argument("--auto", action="store_true", help="transcribe every block as it completes (no server)")
    parser.add_argument("--reset-s", type=float, default=12.0, help="--auto: audio and text context reset period")
    parser.add_argument("--out", default="out", help="--auto: folder for listen_auto.json and listen_auto.png")
    parser.add_argument("--language", default="en")
    add_decoding_options(parser, "whisper-base", "whisper-tiny.en")
    parser.set_defaults(method="as2d")


def input_blocks(args) -> Iterator[AudioBlock]:
    if args.stdin:
        return pcm_blocks(sys.stdin.buffer, args.block_s, args.pcm_format)
    return file_blocks(load_audio(args.audio), args.block_s, args.pace)


def run(args) -> int:
    from asyncspec.models.hf_whisper import WhisperBackend
    from asyncspec.run.models import load_models
    from asyncspec.run.options import DecodingOptions, decode_config

    options = DecodingOptions.from_args(args)
    if args.max_queue < 1:
        raise InputError(f"--max-queue must be at least 1, got {args.max_queue}")
    if args.max_upload_bytes < 1024:
        raise InputError(f"--max-upload-bytes must be at least 1024, got {args.max_upload_bytes}")
    if args.reset_s < args.block_s:
        raise InputError(f"--reset-s ({args.reset_s}) must be at least --block-s ({args.block_s})")
    config = decode_config(options)
    LatestWindow(args.window_s)  # checks --window-s
    blocks = input_blocks(args)  # a bad file fails here, before any model is loaded
    http = None if args.auto else _bind_http(args)  # a busy port or bad option fails before the models load
    with load_models(options, WhisperBackend, "speech") as (target, drafters):
        if args.auto:
            return run_auto(args, options.methods[0], target, drafters, config, blocks)
        return serve(args, options.methods, target, drafters, config, blocks, http)


def _bind_http(args):
    from asyncspec.httpguard import FORM_OVERHEAD_BYTES, bind_listening_socket, guard_config

    body = args.max_upload_bytes + FORM_OVERHEAD_BYTES
    guard = guard_config(
        args.host, args.api_key_file, body, args.allow_host, args.insecure_no_auth, args.max_requests_per_api_key
    )
    connection_limits(args, "")  # bad deadlines fail here, before any model loads
    return bind_listening_socket(args.host, args.port), guard


def serve(args, methods: tuple[str, ...], target, drafters, config, blocks, http) -> int:
    from asyncspec.httpserve import GuardedServer
    from asyncspec.ondemand.engine import Engine
    from asyncspec.ondemand.ingest import Ingestor
    from asyncspec.ondemand.prepared_state import Preparer
    from asyncspec.ondemand.service import UploadLimits, create_app, service_status

    listening, guard = http
    window = LatestWindow(args.window_s)
    preparer = Preparer(target, window, args.language).start()
    ingestor = Ingestor(blocks, window)
    ingestor.subscribe(preparer.on_block)
    engine = Engine(target, drafters, window, preparer, ingestor, args.max_queue, methods[0], config).start()
    ingestor.start()
    print(f"asyncspec listen: http://{args.host}:{args.port} (methods {', '.join(methods)})", file=sys.stderr)
    app = create_app(engine, args.model, UploadLimits(max_bytes=args.max_upload_bytes), guard)
    server = GuardedServer(
        app,
        listening,
        args.max_connections,
        connection_limits(args, "", args.max_upload_bytes + MULTIPART_OVERHEAD_BYTES),
    )
    died = _watch_threads(server, {"preparation": preparer.thread, "request worker": engine.thread})
    try:
        server.run()
    finally:
        engine.close()
        preparer.close()
        print(json.dumps(service_status(engine)), file=sys.stderr)
    if died:
        print(f"asyncspec: error: the {died[0]} thread died; the service stopped", file=sys.stderr)
        return 1
    return 0


def _watch_threads(server, threads: dict) -> list[str]:
    """A background thread that dies stops the whole service, loudly, instead of leaving an HTTP
    front whose requests wait on it; returns the (filled-in later) name of the thread that died."""
    import threading

    died: list[str] = []

    def watch() -> None:
        while not server.should_exit:
            dead = [name for name, thread in threads.items() if not thread.is_alive()]
            if dead:
                died.extend(dead)
                server.should_exit = True
                return
            threading.Event().wait(0.5)

    threading.Thread(target=watch, name="watchdog", daemon=True).start()
    return died


def run_auto(args, method: str, target, drafters, config, blocks) -> int:
    from asyncspec.ondemand.figures import plot_streaming
    from asyncspec.ondemand.ingest import Ingestor
    from asyncspec.ondemand.streaming import AutoTranscriber, records_json, summarize

    window = LatestWindow(min(args.window_s, args.reset_s, 30.0))
    auto = AutoTranscriber(
        target, drafters.get(method), method, config, args.block_s, args.reset_s, args.language, on_record=_print_block
    )
    ingestor = Ingestor(blocks, window)
    ingestor.subscribe(auto.on_block)
    load_before = os.getloadavg()
    auto.start()
    ingestor.start()
    _interrupt_on(signal.SIGINT, signal.SIGTERM)  # also when started in the background, where SIGINT is ignored
    try:
        ingestor.done.wait()
    except KeyboardInterrupt:
        print("asyncspec listen: interrupted; summarising the blocks received so far", file=sys.stderr)
        ingestor.stop()
    auto.end()
    auto.thread.join()
    audio_s = ingestor.status.seconds
    elapsed = (auto.finished_at or 0.0) - (auto.origin or 0.0)
    summary = summarize(auto.records, args.block_s, audio_s, elapsed, auto.dropped_blocks, len(auto.failures))
    summary.update(
        method=method,
        model=args.model,
        dtype=args.dtype,
        block_s=args.block_s,
        reset_s=args.reset_s,
        pace=args.pace,
        cores=os.cpu_count(),
        load_average_before=load_before,
        load_average_after=os.getloadavg(),
        input_error=ingestor.status.error,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"summary": summary, "blocks": records_json(auto.records), "failed_blocks": records_json(auto.failures)}
    (out / "listen_auto.json").write_text(json.dumps(report, indent=1))
    print_auto_summary(summary)
    if auto.records:
        title = f"{method}, {args.model} {args.dtype}: {summary['blocks']} blocks of {args.block_s:g} s, "
        title += f"load {load_before[0]:.1f}"
        plot_streaming(auto.records, args.block_s, out / "listen_auto.png", title)
    print(f"wrote {out / 'listen_auto.json'} and listen_auto.png")
    if auto.failures:  # lost work is an error, even when the other blocks were transcribed
        print(f"asyncspec: error: {len(auto.failures)} block(s) failed (listed in listen_auto.json)", file=sys.stderr)
        return 1
    return 0


def _interrupt_on(*signals: int) -> None:
    def interrupt(number, frame):
        raise KeyboardInterrupt

    for number in signals:
        signal.signal(number, interrupt)


def _print_block(record) -> None:
    print(
        f"[{record.start_s:7.1f}-{record.end_s:7.1f} s] lag {record.completion_lag_s:5.2f} s "
        f"wait {record.queue_wait_s:5.2f} s | {record.text}",
        flush=True,
    )


def print_auto_summary(summary: dict) -> None:
    if summary.get("failed_blocks"):
        print(f"{summary['failed_blocks']} block(s) FAILED and were not transcribed (see failed_blocks in the JSON)")
    if not summary["blocks"]:
        print("no block was transcribed")
        return
    print(f"{'per block':18s} {'mean':>8s} {'p95':>8s} {'max':>8s}")
    for name in ("queue_wait_s", "processing_s", "completion_lag_s", "active_rtf", "resource_rtf", "decode_tps"):
        f = summary[name]
        print(f"{name:18s} {f['mean']:8.3f} {f['p95']:8.3f} {f['max']:8.3f}")
    verdict = "keeps pace" if summary["keeps_pace"] else "does NOT keep pace"
    print(
        f"{summary['blocks']} blocks, {summary['audio_s']:.0f} s of audio in {summary['elapsed_s']:.0f} s "
        f"(resource RTF {summary['overall_resource_rtf']}); final lag {summary['final_completion_lag_s']:.2f} s, "
        f"max backlog {summary['max_backlog_blocks']} blocks, queue-wait slope {summary['queue_wait_slope_s_per_s']}"
        f" s/s, capped outputs {summary['capped_outputs']}: {verdict}; load average "
        f"{summary['load_average_before'][0]:.2f} -> {summary['load_average_after'][0]:.2f}"
    )
