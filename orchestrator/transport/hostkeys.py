"""Host keys are always verified: `strict` refuses an unknown or changed key, `accept-new`
records unknown keys in `known_hosts` (OpenSSH's StrictHostKeyChecking=accept-new). There is
deliberately no option that skips verification.

paramiko is imported here only for clients `ssh.py` made, so it is already loaded (without
invoke, see `ssh._paramiko`).
"""

from __future__ import annotations

import fcntl
import os
import threading
from typing import Any

from .base import log

_CACHE_LOCK = threading.Lock()


def known_hosts_name(host: str, port: int) -> str:
    """The name known_hosts files a server under: `host`, or `[host]:port` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


_KNOWN_HOSTS: dict[str, tuple[tuple[int, int], Any]] = {}


def _known_host_keys(path: str) -> Any:
    """known_hosts parsed once per process (again when the file changes), not once per node: every
    node parsed every line of it, ~2 ms per node at 32 nodes and growing with the cluster."""
    import paramiko

    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    with _CACHE_LOCK:
        cached = _KNOWN_HOSTS.get(path)
        if cached is None or cached[0] != stamp:
            cached = _KNOWN_HOSTS[path] = (stamp, paramiko.HostKeys(path))
    return cached[1]


def install_host_key_policy(client: Any, known_hosts: str, policy: str, hostkey_name: str | None = None) -> None:
    """Verify the server's key against known_hosts with `policy`. With `hostkey_name` (the name
    paramiko looks the server up by: `host`, or `[host]:port` off port 22) only that name's keys
    are given to the client, which is all it consults."""
    import paramiko

    path = os.path.expanduser(known_hosts)
    if hostkey_name is None:
        if os.path.exists(path):
            client.load_host_keys(path)
    else:
        known = _known_host_keys(path)
        for keytype, key in ((known.lookup(hostkey_name) or {}).items() if known is not None else ()):
            client.get_host_keys().add(hostkey_name, keytype, key)

    class StrictPolicy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            raise UnknownHostKey(hostname, key, path)

    class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
        """Like OpenSSH's StrictHostKeyChecking=accept-new: record unknown keys, refuse changed ones."""

        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            client.get_host_keys().add(hostname, key.get_name(), key)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "a", encoding="utf-8") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            log.info("added host key for %s to %s", hostname, path)

    client.set_missing_host_key_policy(StrictPolicy() if policy == "strict" else AcceptNewPolicy())


class UnknownHostKey(Exception):
    """The node offered a host key that known_hosts does not have (strict policy)."""

    def __init__(self, hostname: str, key: Any, known_hosts: str) -> None:
        super().__init__(hostname)
        self.hostname = hostname
        self.fingerprint = key.fingerprint if hasattr(key, "fingerprint") else key.get_name()
        self.known_hosts = known_hosts
