"""Host keys are always verified: `strict` refuses an unknown or changed key, `accept-new`
records unknown keys in `known_hosts` (OpenSSH's StrictHostKeyChecking=accept-new). There is
deliberately no option that skips verification.

known_hosts is read here, not by paramiko (whose parser fails the whole file on a line it cannot
read): a key on an `@revoked` line is refused whichever host offers it, under either policy, and
never recorded; `@cert-authority` lines are skipped (orch does not verify host certificates: a
node known only through one is an unknown host, and the error says so); any other line that is
not a key is skipped.

paramiko is imported here only for clients `ssh.py` made, so it is already loaded (without
invoke, see `ssh._paramiko`).
"""

from __future__ import annotations

import base64
import fcntl
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from ..errors import TransportError
from .base import log

_CACHE_LOCK = threading.Lock()


def known_hosts_name(host: str, port: int) -> str:
    """The name known_hosts files a server under: `host`, or `[host]:port` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


@dataclass
class KnownHosts:
    """One known_hosts file as orch reads it."""

    path: str
    entries: list[Any] = field(default_factory=list)
    """paramiko HostKeyEntry of every plain key line (hashed names included), in file order."""
    revoked: dict[str, int] = field(default_factory=dict)
    """The base64 of every `@revoked` key -> its line number."""
    authorities: list[tuple[str, int]] = field(default_factory=list)
    """(host patterns, line number) of every `@cert-authority` line: not used to verify."""
    skipped: list[int] = field(default_factory=list)
    """Line numbers of lines that hold no key orch can read (bad base64, too few fields)."""

    def keys_for(self, name: str) -> dict[str, Any]:
        """{key type: key} known for `name` (as paramiko looks it up: plain or hashed), none revoked."""
        found: dict[str, Any] = {}
        for e in self.entries:
            if any(n == name or _hashed_as(name, n) for n in e.hostnames) and e.key.get_base64() not in self.revoked:
                found.setdefault(e.key.get_name(), e.key)
        return found


def _readable_name(name: str) -> bool:
    """A plain name, or a hashed one whose salt is the 20 bytes HashKnownHosts writes (paramiko's
    lookup asserts that)."""
    if not name.startswith("|1|"):
        return True
    parts = name.split("|")
    try:
        return len(parts) == 4 and len(base64.b64decode(parts[2], validate=True)) == 20
    except ValueError:
        return False


def _hashed_as(name: str, hashed: str) -> bool:
    """Is `hashed` (`|1|salt|hash`, HashKnownHosts) the hash of `name`? False for a malformed one."""
    import paramiko

    if not hashed.startswith("|1|"):
        return False
    try:
        return bool(paramiko.HostKeys.hash_host(name, hashed) == hashed)
    except Exception:  # a salt that is not 20 bytes of base64: no name hashes to it
        return False


def parse_known_hosts(path: str, text: str) -> KnownHosts:
    """A known_hosts file's text, line by line: never an exception for a line it cannot use."""
    import paramiko

    out = KnownHosts(path)
    for number, raw in enumerate(text.split("\n"), 1):  # lines as OpenSSH reads them: by newline only
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            marker, _, rest = line.partition(" ")
            fields = rest.split()
            if marker == "@revoked" and len(fields) >= 3:
                out.revoked.setdefault(fields[2], number)
            elif marker == "@cert-authority" and fields:
                out.authorities.append((fields[0], number))
            else:
                out.skipped.append(number)
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
        except Exception:  # bad base64, a key paramiko cannot load: this line verifies nothing
            entry = None
        if entry is None or not all(_readable_name(n) for n in entry.hostnames):
            out.skipped.append(number)
        else:
            out.entries.append(entry)
    if out.skipped:
        log.info("%s: lines %s hold no key orch can read; skipped", path, out.skipped[:10])
    return out


_KNOWN_HOSTS: dict[str, tuple[tuple[int, int], KnownHosts]] = {}


def read_known_hosts(path: str) -> KnownHosts:
    """known_hosts parsed once per process (again when the file changes), not once per node: every
    node parsed every line of it, ~2 ms per node at 32 nodes and growing with the cluster. A
    missing or unreadable file knows no host."""
    try:
        st = os.stat(path)
        stamp = (st.st_mtime_ns, st.st_size)
        with _CACHE_LOCK:
            cached = _KNOWN_HOSTS.get(path)
            if cached is None or cached[0] != stamp:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    cached = _KNOWN_HOSTS[path] = (stamp, parse_known_hosts(path, fh.read()))
        return cached[1]
    except OSError:
        return KnownHosts(path)


def install_host_key_policy(
    client: Any, known_hosts: str, policy: str, hostkey_name: str | None = None, node_name: str | None = None
) -> None:
    """Verify the server's key against known_hosts with `policy`. With `hostkey_name` (the name
    paramiko looks the server up by: `host`, or `[host]:port` off port 22) only that name's keys
    are given to the client, which is all it consults; without it (Fabric resolves the name from
    the ssh config) every key. A revoked key is never given: the server offering it reaches the
    policy, which refuses it (`node_name` names the node in that error)."""
    import paramiko

    path = os.path.expanduser(known_hosts)
    known = read_known_hosts(path)
    store = client.get_host_keys()
    if hostkey_name is None:  # HostKeys.add would compare each entry with every other one: appended whole
        store._entries.extend(e for e in known.entries if e.key.get_base64() not in known.revoked)
    else:
        for keytype, key in known.keys_for(hostkey_name).items():
            store.add(hostkey_name, keytype, key)

    def refuse_revoked(hostname: str, key: Any) -> None:
        line = known.revoked.get(key.get_base64())
        if line is not None:
            raise TransportError(
                node_name or hostname,
                "host_key_revoked",
                f"host key of {hostname} ({key.get_name()} {key.fingerprint}) is revoked: {path} line {line} "
                "marks it @revoked",
                "the node still offers a key that was revoked (retired or compromised): give the node a new host "
                f"key (ssh-keygen -A on it, after removing the old one), verify it, then add it to {path}",
            )

    def unknown(hostname: str, key: Any) -> Exception:
        if known.authorities:
            lines = ", ".join(str(n) for _, n in known.authorities[:3])
            return TransportError(
                node_name or hostname,
                "host_key_unknown",
                f"host key of {hostname} ({key.fingerprint}) is not in {path}; its @cert-authority line(s) "
                f"({lines}) are not used: orch does not verify host certificates",
                f"add the node's own key: verify it, then ssh-keyscan {hostname} >> {path} (a [host]:port name "
                "is written as ssh-keyscan -p PORT host)",
            )
        return UnknownHostKey(hostname, key, path)

    class StrictPolicy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            refuse_revoked(hostname, key)
            raise unknown(hostname, key)

    class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
        """Like OpenSSH's StrictHostKeyChecking=accept-new: record unknown keys, refuse changed ones."""

        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            refuse_revoked(hostname, key)
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
