"""The controller's own clock against `checks.clock.ntp_server` (ntplib), measured beside the probe.

The nodes measure themselves against the server (SNTP, in the probe); without this, nobody knows
whether the machine orch runs on is right: its clock stamps `orch logs --since`, the log ages of
`orch status`, the run ids. Best of a few samples by round trip, as the probe's. Without a server
the nodes are measured against the controller itself, and every offset is relative to its clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SAMPLES = 4
TIMEOUT_S = 2.0


@dataclass(frozen=True)
class ControllerClock:
    """The controller's clock minus the NTP server's (ms), or why it is not known."""

    server: str | None
    offset_ms: float | None = None
    delay_ms: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "offset_ms": None if self.offset_ms is None else round(self.offset_ms, 3),
            "delay_ms": None if self.delay_ms is None else round(self.delay_ms, 3),
            "error": self.error,
        }


def split_server(server: str) -> tuple[str, int]:
    """`host` or `host:port` (the inventory's spelling; an IPv6 address in brackets) → (host, port)."""
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        return host, int(rest.lstrip(":") or 123)
    if server.count(":") == 1:
        host, port = server.split(":")
        return host, int(port)
    return server, 123


def measure(server: str | None, samples: int = SAMPLES, timeout: float = TIMEOUT_S) -> ControllerClock:
    """Ask the server `samples` times; the sample with the shortest round trip wins. Never raises."""
    if not server:
        return ControllerClock(None)
    import ntplib

    host, port = split_server(server)
    client = ntplib.NTPClient()
    best: tuple[float, float] | None = None
    errors: list[str] = []
    for _ in range(samples):
        try:
            got = client.request(host, version=3, port=port, timeout=timeout)
        except (ntplib.NTPException, OSError, ValueError) as exc:
            errors.append(str(exc) or type(exc).__name__)
            continue
        # ntplib's offset is the server's clock minus ours: the controller minus the server is its negative
        sample = (-got.offset * 1000, got.delay * 1000)
        if best is None or sample[1] < best[1]:
            best = sample
    if best is None:
        return ControllerClock(server, error="; ".join(dict.fromkeys(errors)) or "no answer")
    return ControllerClock(server, best[0], best[1])
