"""`asyncspec link`: run the emulated edge–cloud link as a proxy in front of the cloud service."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from asyncspec.cloudedge.link.profiles import DEFAULT_LINK_SCALE, DEFAULT_ONE_WAY_DELAY_MS, PROFILE_RATES_MBIT
from asyncspec.errors import InputError

HELP = "emulated asymmetric edge-cloud link: a shaping TCP proxy"
DESCRIPTION = (
    "Forwards TCP connections from --listen to --target with separate uplink (from the "
    "connecting side) and downlink rates and one-way delays. Profiles (up/down Mbit/s): "
    + ", ".join(f"{name} {up:g}/{down:g}" for name, (up, down) in PROFILE_RATES_MBIT.items())
    + f"; default one-way delay {DEFAULT_ONE_WAY_DELAY_MS:g} ms."
)


def add_arguments(link: argparse.ArgumentParser) -> None:
    link.add_argument("--profile", help="weak, medium or strong (or give --up and --down)")
    link.add_argument("--up", type=float, help="uplink Mbit/s (overrides the profile's)")
    link.add_argument("--down", type=float, help="downlink Mbit/s (overrides the profile's)")
    link.add_argument(
        "--delay-ms", type=float, help=f"one-way delay, both directions (default {DEFAULT_ONE_WAY_DELAY_MS:g})"
    )
    link.add_argument("--up-delay-ms", type=float, help="uplink one-way delay (overrides --delay-ms)")
    link.add_argument("--down-delay-ms", type=float, help="downlink one-way delay (overrides --delay-ms)")
    link.add_argument(
        "--link-scale",
        type=float,
        default=1.0,
        help=f"divide both rates by S (S={DEFAULT_LINK_SCALE:g}: a GPU verifier's upload:verify ratio; see README)",
    )
    link.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to accept connections on (port 0: any)")
    link.add_argument("--target", required=True, help="HOST:PORT of the service behind the link")
    link.add_argument("--client-side", choices=["edge", "cloud"], default="edge", help="who connects to --listen")
    link.add_argument("--kernel", action="store_true", help="rates by tc htb on loopback (root), delay in userspace")


def parse_address(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"{what} must be HOST:PORT, got {text!r}")
    return host, int(port)


def run(args: argparse.Namespace) -> int:
    from asyncspec.cloudedge.link.profiles import resolve_profile
    from asyncspec.cloudedge.link.proxy import ShapingProxy

    profile = resolve_profile(
        args.profile, args.up, args.down, args.delay_ms, args.up_delay_ms, args.down_delay_ms, args.link_scale
    )
    listen, target = parse_address(args.listen, "--listen"), parse_address(args.target, "--target")
    shaper = None
    if args.kernel:
        from asyncspec.cloudedge.link.kernel import KernelShaper

        shaper = KernelShaper(profile, target_port=target[1], client_is_edge=args.client_side == "edge")
        profile = shaper.userspace_profile()
    proxy = ShapingProxy(profile, target, listen, client_is_edge=args.client_side == "edge")

    def ready(p: ShapingProxy) -> None:
        host, port = p.address
        rates = "tc htb" if shaper else "userspace"
        print(f"link ready on {host}:{port} -> {target[0]}:{target[1]} ({rates}); {profile.describe()}", flush=True)

    with shaper if shaper is not None else contextlib.nullcontext():
        try:
            asyncio.run(_serve_until_signal(proxy, ready))
        except OSError as error:
            raise InputError(f"cannot listen on {args.listen}: {error.strerror or error}") from None
    from asyncspec.cloudedge.link.process import stats_line

    print(stats_line(proxy.stats), file=sys.stderr)
    return 0


async def _serve_until_signal(proxy, ready) -> None:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        from asyncspec.cloudedge.link.proxy import serve_forever

        await serve_forever(proxy, ready)
