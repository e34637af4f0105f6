"""Optional kernel rate shaping for the link: `tc` htb classes on loopback, selected by the service port.

With root and `tc`, `asyncspec link --kernel` lets the kernel pace the two directions and keeps only the
propagation delay in the userspace proxy (this kernel has no netem). Traffic between the proxy and the
service is classified by port: packets to the service port take the uplink class, packets from it the
downlink class (swapped when the cloud is the connecting side); all other loopback traffic is left
unclassified and passes unshaped (htb's default class does not exist). Packets under 256 bytes (pure ACKs)
are exempt too: shaped, the downlink's ACKs would queue behind uplink data and throttle the downlink, and
the userspace proxy (which terminates TCP on each side) does not shape them either.

Caveat: loopback's MTU is 65,536 bytes and segments reach that size, so each class needs a burst of at
least that much — a smaller burst makes htb/tbf drop every large packet silently. A message smaller than
the burst therefore crosses an idle kernel-shaped link unpaced; the userspace pacer has no such burst.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from dataclasses import replace

from asyncspec.cloudedge.link.profiles import LinkProfile
from asyncspec.errors import InputError

LOOPBACK_MTU = 65536
MIN_BURST_BYTES = 2 * LOOPBACK_MTU
_UP, _DOWN, _SMALL, _UNCLASSIFIED = "1:10", "1:20", "1:30", "99"
SMALL_PACKET_BYTES = 256  # pure ACKs and other tiny packets: exempt, as they are in the userspace proxy


def kernel_shaping_available() -> bool:
    return os.geteuid() == 0 and shutil.which("tc") is not None


class KernelShaper:
    """Context manager installing (and always removing) the htb classes on `device`."""

    def __init__(self, profile: LinkProfile, target_port: int, client_is_edge: bool = True, device: str = "lo"):
        if not kernel_shaping_available():
            raise InputError("--kernel needs root and the tc tool (iproute2); without it the userspace link shapes")
        if not (math.isfinite(profile.up_mbit) and math.isfinite(profile.down_mbit)):
            raise InputError("--kernel needs finite rates")
        self.profile, self.port, self.client_is_edge, self.device = profile, target_port, client_is_edge, device
        self.installed = False

    def userspace_profile(self) -> LinkProfile:
        """What the proxy still does itself: the delays, with unlimited rates."""
        return replace(self.profile, up_mbit=math.inf, down_mbit=math.inf)

    def commands(self) -> list[list[str]]:
        up_rate, down_rate = self.profile.up_mbit, self.profile.down_mbit
        to_service, from_service = (up_rate, down_rate) if self.client_is_edge else (down_rate, up_rate)
        to_port = ["match", "ip", "dport", str(self.port), "0xffff"]
        from_port = ["match", "ip", "sport", str(self.port), "0xffff"]
        # The IP total length (bytes 2-3) tells ACKs from data, but segmentation-offload packets reach the
        # qdisc with total length 0 (seen on this kernel's loopback), so those are classified first.
        gso = ["match", "u16", "0x0000", "0xffff", "at", "2"]
        small = ["match", "u16", "0x0000", f"{0xFFFF & ~(SMALL_PACKET_BYTES - 1):#06x}", "at", "2"]
        return [
            ["qdisc", "add", "dev", self.device, "root", "handle", "1:", "htb", "default", _UNCLASSIFIED],
            self._class(_UP, to_service),
            self._class(_DOWN, from_service),
            self._class(_SMALL, 10_000.0),
            self._filter(1, gso + to_port, _UP),
            self._filter(1, gso + from_port, _DOWN),
            self._filter(2, small, _SMALL),
            self._filter(3, to_port, _UP),
            self._filter(3, from_port, _DOWN),
        ]

    def _filter(self, prio: int, matches: list[str], classid: str) -> list[str]:
        head = ["filter", "add", "dev", self.device, "parent", "1:", "protocol", "ip", "prio", str(prio), "u32"]
        return head + matches + ["flowid", classid]

    def _class(self, classid: str, mbit: float) -> list[str]:
        bits = f"{round(mbit * 1e6)}bit"
        burst = str(max(MIN_BURST_BYTES, round(mbit * 1e6 / 8 * 0.001)))  # >= 2 MTU, ~1 ms of traffic
        return ["class", "add", "dev", self.device, "parent", "1:", "classid", classid, "htb"] + [
            "rate",
            bits,
            "ceil",
            bits,
            "burst",
            burst,
            "cburst",
            burst,
        ]

    def __enter__(self) -> KernelShaper:
        current = _tc(["qdisc", "show", "dev", self.device])
        if re.search(r"qdisc (?!noqueue|pfifo_fast|fq_codel|mq )\S+ \S+ root", current):
            raise InputError(f"{self.device} already has a root qdisc ({current.strip()}); not replacing it")
        self.installed = True
        try:
            for command in self.commands():
                _tc(command)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        if self.installed:
            subprocess.run(["tc", "qdisc", "del", "dev", self.device, "root"], capture_output=True, check=False)
            self.installed = False


def _tc(arguments: list[str]) -> str:
    done = subprocess.run(["tc", *arguments], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InputError(f"tc {' '.join(arguments)} failed: {done.stderr.strip()}")
    return done.stdout
