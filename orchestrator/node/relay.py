"""The copy chain's relay: one link of the pipelined chain that carries `orch sync`'s files and
`orch image push`'s image to N nodes for the cost of one copy from the controller.

Runs on every member of a chain (`python -c FROM_STDIN_OPEN orch-relay TID`, the program on its
stdin, built by `orchestrator.node.program("relay")`), stdlib only, any Python >= 3.8, nothing of
orch. The controller's side is `orchestrator.remote.chain`.

Channels:
- stdin, from the controller (over the node's transport: SSH, or whatever reaches the node):
  frames. `C` + length + JSON: a command (`config` first; `go`, `skip`, `next`, `tail`, `abort`,
  `ping`). `D` data frames (below) when the controller itself feeds this member (the head; or a
  member whose predecessor is gone).
- stdout, to the controller: one line per event, `@relay {JSON}` (`ready`, `at` every
  heartbeat, `bad`, `stranger`, `upstream`, `downfail`, `sinkfail`, `done`, `bye`, `error`);
  whatever else a login shell prints there is not an event.
- TCP, between members: the relay listens on the node's address; its predecessor connects,
  proves it holds the transfer's secret, learns where to resume, and sends data frames; acks
  flow back on the same connection.

Frames (big-endian): `D offset:Q length:I sha256:32 mac:32` then `length` bytes of the stream at
`offset`; `mac` = HMAC-SHA256(secret, "D" + tid + offset + length + sha256). A frame is accepted
only at the offset this member has verified up to, and only when both its MAC and its content
digest hold; it is forwarded byte for byte. `A offset:Q mac:32`: everything below `offset` is held
by this member and every member after it (the chain-wide ack, what lets a predecessor forget).

Handshake, on each TCP connection: the listener sends `ORCHRLY1` + a 16-byte nonce; the connector
answers `index:I nonce:16 mac:32` (mac over "P" + tid + both nonces + index); a wrong MAC is a
stranger, refused (and reported). The listener answers `got:Q mac:32` (mac over "S" + tid + the
connector's nonce + got), so the connector knows it reached the member, and resumes at `got`.

Bounded memory: frames are kept until both this member's sink and its successor (chain-wide) hold
them; reading stops while more than `window` bytes are held (the controller keeps to the same
window for what it sends the head). Self-healing is the controller's: it tells a predecessor
(`next`) to connect to another member, which resumes from its own verified offset.

The sink: `files` writes each file this member lacks to a temporary name beside it
(`.NAME.orch-TID`), and renames it into place once the sha256 of what the file now holds equals
the one the controller sent after its bytes; `image` streams into the runtime's load command and
reports the ID it prints. A sink that fails (a full disk, the load failing) is reported
(`sinkfail`) and the member goes on relaying. An image's load that takes no byte for the config's
`stall_s` (a stopped process, a hung disk) is ended by the relay (`sinkfail` with `stalled`),
which goes on relaying: the members after it complete. `abort`, or the controller gone (stdin
closed, or no frame from it for `silence_s`), removes every temporary file, ends the load, and
exits 3.

Test hook (for tests only; docs/SECURITY.md says why it is harmless): with
`ORCH_RELAY_TEST_FLIP=1` in its environment a relay flips one byte of the first frame it
forwards, once: its successor must catch the bad chunk and get it again
(tests/integration/test_chain_netns.py).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Callable

MAGIC = b"ORCHRLY1"
DATA = struct.Struct(">QI32s32s")
"""After the `D`: offset, length, the chunk's sha256, the MAC."""
ACK = struct.Struct(">Q32s")
HELLO = struct.Struct(">I16s32s")
"""The connector's answer to the listener's nonce: the index it believes it reaches, its nonce, the MAC."""
RESUME = struct.Struct(">Q32s")
CTRL = struct.Struct(">I")
HEADER = 1 + DATA.size
DIGEST = 32
"""The bytes after each file in a `files` stream: its sha256."""
MAX_CTRL = 1 << 26
"""The largest command the controller sends (the manifest of a big tree)."""
MAX_CHUNK = 1 << 24
SLICE = 1 << 16
"""The most bytes one write hands an image's load (a pipe's size): its progress, as it takes them."""
HANDSHAKE_S = 10.0
CONNECT_S = 5.0
"""How long a connection to the successor may take: its tries end (`downfail`, the controller
then feeds the successor itself) well before the controller's stall judge (30 s)."""
RECONNECTS = 3
"""How often a member connects again to the same successor (after a bad chunk, a reset) before it
says it cannot reach it."""
EVENT = "@relay "
FLIP = "ORCH_RELAY_TEST_FLIP"
LOAD_FLOOR_BPS = 8 << 20
"""The slowest rate at which a load may write out an image it took whole (`finish_s`)."""


def finish_s(stall_s: float, size: int) -> float:
    """How long an image's load may take to finish once it took the last byte of `size`: its stall
    deadline, plus the image written at `LOAD_FLOOR_BPS` (its layers unpacked, committed). Past
    it the load is ended as stalled (a hung disk after the stream, a load stopped then)."""
    return stall_s + size / LOAD_FLOOR_BPS


class Refused(Exception):
    """A frame or a handshake that does not hold (wrong MAC, wrong digest, wrong shape)."""


def mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"".join(parts), hashlib.sha256).digest()


def data_frame(secret: bytes, tid: bytes, offset: int, payload: bytes) -> bytes:
    """The whole frame of `payload` at `offset` (what the controller feeds; relays forward it as is)."""
    digest = hashlib.sha256(payload).digest()
    head = struct.pack(">QI32s", offset, len(payload), digest)
    return b"D" + head + mac(secret, b"D", tid, head) + payload


def check_data(secret: bytes, tid: bytes, header: bytes) -> tuple[int, int, bytes]:
    """(offset, length, digest) of a data frame's header (after the `D`); Refused on a bad MAC."""
    offset, length, digest, got = DATA.unpack(header)
    if length > MAX_CHUNK:
        raise Refused(f"a chunk of {length} bytes")
    if not hmac.compare_digest(got, mac(secret, b"D", tid, header[: DATA.size - 32])):
        raise Refused(f"a chunk whose MAC does not hold at offset {offset}")
    return offset, length, digest


def check_payload(offset: int, digest: bytes, payload: bytes) -> None:
    if hashlib.sha256(payload).digest() != digest:
        raise Refused(f"a chunk whose sha256 does not match at offset {offset}")


def ack_frame(secret: bytes, tid: bytes, offset: int) -> bytes:
    head = struct.pack(">Q", offset)
    return b"A" + head + mac(secret, b"A", tid, head)


def check_ack(secret: bytes, tid: bytes, body: bytes) -> int:
    offset, got = ACK.unpack(body)
    if not hmac.compare_digest(got, mac(secret, b"A", tid, body[:8])):
        raise Refused("an ack whose MAC does not hold")
    return offset


def ctrl_frame(message: dict) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return b"C" + CTRL.pack(len(body)) + body


def hello_answer(secret: bytes, tid: bytes, challenge: bytes, index: int, nonce: bytes) -> bytes:
    """The connector's answer to a listener's challenge."""
    return HELLO.pack(index, nonce, mac(secret, b"P", tid, challenge, nonce, struct.pack(">I", index)))


def check_hello(secret: bytes, tid: bytes, challenge: bytes, index: int, answer: bytes) -> bytes:
    """The connector's nonce, after its answer proved the secret (for this member's index); Refused otherwise."""
    theirs, nonce, got = HELLO.unpack(answer)
    if theirs != index or not hmac.compare_digest(
        got, mac(secret, b"P", tid, challenge, nonce, struct.pack(">I", theirs))
    ):
        raise Refused("a connection that does not hold the transfer's secret")
    return nonce


def resume_answer(secret: bytes, tid: bytes, nonce: bytes, got: int) -> bytes:
    head = struct.pack(">Q", got)
    return head + mac(secret, b"S", tid, nonce, head)


def check_resume(secret: bytes, tid: bytes, nonce: bytes, answer: bytes) -> int:
    got, theirs = RESUME.unpack(answer)
    if not hmac.compare_digest(theirs, mac(secret, b"S", tid, nonce, answer[:8])):
        raise Refused("a listener that does not hold the transfer's secret")
    return got


def read_exact(read: Callable[[int], bytes], n: int) -> bytes:
    """n bytes from `read` (a file's or socket file's read), or EOFError when the stream ends first."""
    data = read(n)
    if len(data) != n:
        raise EOFError(f"the stream ended after {len(data)} of {n} bytes")
    return data


def layout(sizes: list[int]) -> list[int]:
    """Each entry's offset in a `files` stream: its bytes, then its sha256 (DIGEST bytes)."""
    out, at = [], 0
    for size in sizes:
        out.append(at)
        at += size + DIGEST
    return out


def ranges(indices: list[int]) -> list[list[int]]:
    """Sorted indices as [start, end) runs: how lists of manifest entries travel."""
    out: list[list[int]] = []
    for i in sorted(indices):
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


def expand(runs: object, limit: int | None = None) -> list[int]:
    """The indices of [start, end) runs; with `limit`, ValueError unless each run is two integers
    within [0, limit] (runs a node sent: held to their shape before they size anything)."""
    if limit is None:
        return [i for start, end in runs for i in range(start, end)]  # type: ignore[attr-defined]
    if not isinstance(runs, list) or len(runs) > limit:
        raise ValueError("not a list of runs")
    out: list[int] = []
    for run in runs:
        ok = isinstance(run, list) and len(run) == 2 and all(type(x) is int for x in run)
        if not ok or not 0 <= run[0] < run[1] <= limit or (out and run[0] <= out[-1]):
            raise ValueError(f"a run {run!r} outside 0..{limit}, or out of order")
        out.extend(range(run[0], run[1]))
    return out


def up_to_date(entry: dict, st: os.stat_result | None, checksum: bool, path: str) -> bool:
    """rsync's rule for one regular file: the node's file has the same size and modification time
    (with `checksum`: the same size and sha256)."""
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != entry["s"]:
        return False
    if checksum:
        return sha256_of(path) == entry.get("h")
    mine, theirs = st.st_mtime_ns, entry["mt"]
    return mine == theirs or (mine % 1_000_000_000 == 0 and mine // 1_000_000_000 == theirs // 1_000_000_000)


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def free_bytes(path: str) -> tuple[str, int, int]:
    """(the nearest existing directory at or above `path`, its filesystem's free bytes, its device)."""
    where = path
    while True:
        try:
            fs = os.statvfs(where)
            return where, fs.f_bavail * fs.f_frsize, os.stat(where).st_dev
        except OSError:
            if where in ("/", ""):
                raise
            where = os.path.dirname(where) or "/"


def temp_name(path: str, tid: str) -> str:
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.orch-{tid[:12]}")


class Say:
    """The control channel to the controller: one event per line, whole lines only."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, event: str, **fields: object) -> None:
        fields["ev"] = event
        line = (EVENT + json.dumps(fields, separators=(",", ":")) + "\n").encode()
        with self.lock:
            try:
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()
            except (OSError, ValueError):
                pass  # the controller is gone: the silence watchdog ends this relay


class FileSink:
    """Writes the files of a `files` stream this member lacks, each to a temporary name, renamed
    into place once the sha256 of what it holds is the controller's."""

    def __init__(self, cfg: dict, go: dict) -> None:
        self.tid = cfg["tid"]
        self.entries = cfg["manifest"]
        self.send = expand(go["send"])
        """Indices of the manifest in the stream's order."""
        self.want = set(expand(go["want"]))
        sizes = [self.entries[i]["s"] for i in self.send]
        self.starts = layout(sizes)
        self.pos = 0
        """Index into `send` of the entry being written."""
        self.fd = -1
        self.temp = ""
        self.trailer = b""
        self.temps: set[str] = set()
        self.written = 0
        self.files = 0
        self.failed = ""

    def prepare(self) -> None:
        for entry in self.entries:
            if entry["t"] == "d":
                st = lstat(entry["p"])
                if st is None:
                    os.makedirs(entry["p"], exist_ok=True)
                    os.chmod(entry["p"], entry["m"])
                elif stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) != entry["m"]:
                    os.chmod(entry["p"], entry["m"])
        for i in self.want:
            os.makedirs(os.path.dirname(self.entries[i]["p"]), exist_ok=True)

    def write(self, offset: int, data: memoryview) -> None:
        """The stream's bytes at `offset` (contiguous with the last call)."""
        while data:
            if self.pos >= len(self.send):
                return
            index = self.send[self.pos]
            entry = self.entries[index]
            start = self.starts[self.pos]
            end_bytes = start + entry["s"]
            if offset < end_bytes:
                n = min(len(data), end_bytes - offset)
                if index in self.want and not self.failed:
                    self._bytes(entry, offset - start, data[:n])
                offset += n
                data = data[n:]
                continue
            n = min(len(data), end_bytes + DIGEST - offset)
            self.trailer += bytes(data[:n])
            offset += n
            data = data[n:]
            if len(self.trailer) == DIGEST:
                if index in self.want and not self.failed:
                    if entry["s"] == 0:
                        self._bytes(entry, 0, memoryview(b""))
                    self._finish(entry)
                self.trailer = b""
                self.pos += 1

    def _bytes(self, entry: dict, at: int, data: memoryview) -> None:
        if self.fd < 0:
            self.temp = temp_name(entry["p"], self.tid)
            self.temps.add(self.temp)
            self.fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        view = data
        while view:
            view = view[os.write(self.fd, view) :]
        self.written += len(data)

    def _finish(self, entry: dict) -> None:
        os.close(self.fd)
        self.fd = -1
        got = sha256_of(self.temp)
        if got != self.trailer.hex():
            raise OSError(
                errno.EIO,
                f"{entry['p']} holds sha256 {got[:12]} after writing, not the controller's {self.trailer.hex()[:12]}",
            )
        os.chmod(self.temp, entry["m"])
        os.utime(self.temp, ns=(entry["mt"], entry["mt"]))
        os.rename(self.temp, entry["p"])
        self.temps.discard(self.temp)
        self.temp = ""
        self.files += 1

    def end(self) -> dict:
        """After the last byte: links and the modes of the files already in place, as rsync -a leaves them."""
        for entry in self.entries:
            st = lstat(entry["p"])
            if entry["t"] == "l":
                if st is not None and stat.S_ISLNK(st.st_mode) and os.readlink(entry["p"]) == entry["l"]:
                    continue
                temp = temp_name(entry["p"], self.tid)
                self.temps.add(temp)
                os.symlink(entry["l"], temp)
                os.rename(temp, entry["p"])
                self.temps.discard(temp)
            elif (
                entry["t"] == "f"
                and st is not None
                and stat.S_ISREG(st.st_mode)
                and stat.S_IMODE(st.st_mode) != entry["m"]
            ):
                os.chmod(entry["p"], entry["m"])
        return {"files": self.files, "bytes": self.written}

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        for temp in list(self.temps):
            try:
                os.unlink(temp)
            except OSError:
                pass
        self.temps.clear()


class ImageSink:
    """Streams an image archive into the runtime's load command, then asks the runtime what the
    image's name resolves to (its `inspect`: the controller reads the answer)."""

    def __init__(self, cfg: dict) -> None:
        self.argv = cfg["load"]
        self.inspect = cfg["inspect"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.written = 0
        """Bytes the load took (a pipe's worth at a time: how far a stalled one got)."""
        self.took_at = 0.0
        """When it took the latest (monotonic)."""
        self.failed = ""
        self.err = b""

    def prepare(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._err = threading.Thread(target=self._drain, daemon=True)
        self._err.start()

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in iter(self.proc.stderr.readline, b""):
            self.err = (self.err + line)[-4000:]

    def write(self, offset: int, data: memoryview) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            for at in range(0, len(data), SLICE):
                piece = data[at : at + SLICE]
                self.proc.stdin.write(piece)
                self.proc.stdin.flush()
                self.written += len(piece)
                self.took_at = time.monotonic()
        except BrokenPipeError:
            raise OSError(errno.EPIPE, f"load exited {self._code()} before the image's last byte") from None

    def _code(self) -> int | None:
        """The load's exit code, once it ended and its stderr is read to the end."""
        code = self.proc.wait() if self.proc is not None else None
        self._err.join(5)
        return code

    def said(self) -> str:
        """The end of the load's stderr (the controller shows its last lines)."""
        return self.err.decode("utf-8", "replace")[-4000:]

    def end(self) -> dict:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.stdout.read()  # what load prints of itself: the ID is asked for below
        code = self._code()
        if code != 0:
            raise OSError(errno.EIO, f"load exited {code}")
        asked = subprocess.run(self.inspect, stdin=subprocess.DEVNULL, capture_output=True)
        said = {
            "code": asked.returncode,
            "out": asked.stdout.decode("utf-8", "replace")[-4000:],
            "err": asked.stderr.decode("utf-8", "replace")[-4000:],
        }
        return {"held": said, "bytes": self.written}

    def abort(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:  # a stopped load (SIGSTOP, a debugger) takes its SIGTERM only once it runs
                os.kill(self.proc.pid, signal.SIGCONT)
            except OSError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Relay:
    """One member of the chain: verifies what comes from upstream, hands it to its sink, forwards it."""

    def __init__(self, cfg: dict, say: Say) -> None:
        self.cfg = cfg
        self.say = say
        self.secret = bytes.fromhex(cfg["secret"])
        self.tid = cfg["tid"]
        self.btid = self.tid.encode()
        self.index = cfg["index"]
        self.window = cfg["window"]
        self.total = 0
        self.cv = threading.Condition()
        self.frames: deque[tuple[int, bytes]] = deque()
        """(offset, whole frame) from the lowest offset some reader still needs."""
        self.got = 0
        """Verified bytes received: the offset the next frame must start at."""
        self.sunk = 0
        self.sent = 0
        """The offset the next frame forwarded starts at."""
        self.acked = 0
        """What the successor (and every member after it) holds."""
        self.down: socket.socket | None = None
        self.down_to: tuple[str, int, int] | None = None
        self.tail = True
        self.down_gen = 0
        self.up: socket.socket | None = None
        self.up_gen = 0
        self.sink: FileSink | ImageSink | None = None
        self.sink_done = False
        self.finished = False
        self.aborted = ""
        self.wait = "up"
        self.heard = time.monotonic()
        self.flip = os.environ.get(FLIP) == "1"
        self.resent = 0
        self.listener: socket.socket | None = None
        self.acked_up = -1
        """The last ack the predecessor was sent (a TCP upstream's)."""
        self.first_t: float | None = None
        self.last_t = 0.0
        """When the first and the latest verified byte arrived (this node's clock)."""
        self.stall_s = cfg.get("stall_s")
        """The longest an image's load may take to take one frame (None: no deadline)."""
        self.judging = threading.Lock()
        """Held while the stall judge ends a load and says so: the sink is done only after."""
        self.writing: float | None = None
        """Since when the sink has been handing its load the frame at `sunk` (None: not now; the
        load's last slice taken, `ImageSink.took_at`, counts as progress too)."""
        self.finishing: float | None = None
        """Since when the image's load, every byte taken, has been finishing (None: not yet)."""

    # ------------------------------------------------------------------ set-up

    def listen(self) -> int:
        sock = socket.socket(socket.AF_INET6 if ":" in self.cfg.get("addr", "") else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.cfg.get("addr") or "", 0))
        except OSError:
            sock.bind(("", 0))
        sock.listen(8)
        self.listener = sock
        threading.Thread(target=self._accept, daemon=True).start()
        return sock.getsockname()[1]

    def scan(self) -> dict:
        """What this member holds: for files, the manifest entries it lacks and the room on each
        filesystem they go to; for an image, the ID it holds and the room where the load writes."""
        out: dict[str, object] = {}
        if self.cfg["mode"] == "files":
            need: list[int] = []
            fresh: list[int] = []
            room: dict[int, dict] = {}
            for i, entry in enumerate(self.cfg["manifest"]):
                if entry["t"] != "f":
                    continue
                st = lstat(entry["p"])
                if st is None:
                    fresh.append(i)
                if not up_to_date(entry, st, self.cfg.get("checksum", False), entry["p"]):
                    need.append(i)
                    where, free, dev = free_bytes(os.path.dirname(entry["p"]))
                    slot = room.setdefault(dev, {"path": where, "free": free, "need": 0})
                    slot["need"] += entry["s"]
            out["need"] = ranges(need)
            out["fresh"] = ranges(fresh)
            out["room"] = list(room.values())
        else:  # the runtime's answers, asked at once (each is a runtime process of its own)
            pipe = subprocess.PIPE
            inspect = subprocess.Popen(self.cfg["inspect"], stdout=pipe, stderr=pipe)
            asked = [
                (what, subprocess.Popen(argv, stdout=pipe, stderr=pipe)) for what, argv in self.cfg.get("room", [])
            ]
            said, err = inspect.communicate()
            out["held"] = {
                "code": inspect.returncode,
                "out": said.decode("utf-8", "replace")[-2000:],
                "err": err.decode("utf-8", "replace")[-2000:],
            }
            rooms = []
            for what, proc in asked:
                lines = proc.communicate()[0].decode("utf-8", "replace").strip().splitlines()
                if proc.returncode == 0 and lines and lines[-1].startswith("/"):
                    at, free, dev = free_bytes(lines[-1])
                    rooms.append({"what": what, "path": at, "free": free, "dev": dev})
            out["room"] = rooms
        return out

    # ------------------------------------------------------------------ upstream

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._greet, args=(conn, peer), daemon=True).start()

    def _greet(self, conn: socket.socket, peer: tuple) -> None:
        """A connection from a predecessor, once it proves the secret; a stranger is refused."""
        try:
            conn.settimeout(HANDSHAKE_S)
            challenge = os.urandom(16)
            conn.sendall(MAGIC + challenge)
            nonce = check_hello(self.secret, self.btid, challenge, self.index, _recv_exact(conn, HELLO.size))
            with self.cv:
                got = self.got
                old, self.up = self.up, conn
                self.up_gen += 1
                gen = self.up_gen
            conn.sendall(resume_answer(self.secret, self.btid, nonce, got))
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (Refused, OSError, EOFError, struct.error) as exc:
            if isinstance(exc, Refused):
                self.say("stranger", peer=str(peer[0]), why=str(exc))
            conn.close()
            return
        if old is not None:
            _close(old)
        self.say("upstream", peer=str(peer[0]), at=got)
        threading.Thread(target=self._acks_up, args=(conn, gen), daemon=True).start()
        reader = conn.makefile("rb", buffering=1 << 20)
        try:
            while True:
                kind = reader.read(1)
                if not kind:
                    return
                if kind != b"D":
                    raise Refused(f"a frame of kind {kind!r}")
                if not self.take(reader.read, gen):
                    return
        except (Refused, OSError, EOFError, struct.error) as exc:
            if isinstance(exc, Refused):
                self.say("bad", peer=str(peer[0]), at=self.got, why=str(exc))
        finally:
            _close(conn)

    def take(self, read: Callable[[int], bytes], gen: int) -> bool:
        """Read one data frame (after its `D`) from the upstream `gen` (0: the controller's stdin),
        verify it and keep it; False when that upstream is no longer this member's."""
        header = read_exact(read, DATA.size)
        offset, length, digest = check_data(self.secret, self.btid, header)
        payload = read_exact(read, length)
        check_payload(offset, digest, payload)
        frame = b"D" + header + payload
        with self.cv:
            if gen and gen != self.up_gen:
                return False
            if offset != self.got or self.aborted:
                return True  # a frame already held, or one past a gap (a resend is on its way)
            self.frames.append((offset, frame))
            self.got += length
            self.last_t = time.monotonic()
            if self.first_t is None:
                self.first_t = self.last_t
            self.cv.notify_all()
            while gen and self.got - self._low() > self.window and not self.aborted and gen == self.up_gen:
                self.wait = "down"
                self.cv.wait(1.0)
        return True

    def _low(self) -> int:
        """The lowest offset some reader of this member still needs (its sink, its successor)."""
        low = self.sunk
        if not self.tail:
            low = min(low, self.acked)
        return low

    def _ack_value(self) -> int:
        return self.got if self.tail else min(self.got, self.acked)

    def _acks_up(self, conn: socket.socket, gen: int) -> None:
        """Tell the predecessor on `conn` what this member and every one after it hold."""
        last = -1
        while True:
            with self.cv:
                while self._ack_value() == last and gen == self.up_gen and not self.aborted:
                    self.cv.wait(1.0)
                if gen != self.up_gen or self.aborted:
                    return
                last = self._ack_value()
            try:
                conn.sendall(ack_frame(self.secret, self.btid, last))
            except OSError:
                return
            with self.cv:
                self.acked_up = last
                self.cv.notify_all()

    # ------------------------------------------------------------------ downstream

    def connect(self, host: str, port: int, index: int) -> None:
        """Make the member at host:port this member's successor (the controller's `next`)."""
        with self.cv:
            self.down_gen += 1
            gen = self.down_gen
            old, self.down = self.down, None
            self.down_to = (host, port, index)
            self.tail = False
            self.acked = 0
            self.cv.notify_all()
        if old is not None:
            _close(old)
        threading.Thread(target=self._forward, args=(gen,), daemon=True).start()

    def become_tail(self) -> None:
        with self.cv:
            self.down_gen += 1
            old, self.down = self.down, None
            self.down_to = None
            self.tail = True
            self.cv.notify_all()
        if old is not None:
            _close(old)

    def _dial(self, gen: int, again: bool) -> socket.socket | None:
        """Connect to the successor and learn where it resumes; None when it cannot be reached."""
        assert self.down_to is not None
        host, port, index = self.down_to
        why = ""
        for attempt in range(RECONNECTS):
            with self.cv:
                if gen != self.down_gen or self.aborted:
                    return None
            try:
                sock = socket.create_connection((host, port), timeout=CONNECT_S)
                try:
                    hello = _recv_exact(sock, len(MAGIC) + 16)
                    if hello[: len(MAGIC)] != MAGIC:
                        raise Refused("the port does not answer as a relay")
                    nonce = os.urandom(16)
                    sock.sendall(hello_answer(self.secret, self.btid, hello[len(MAGIC) :], index, nonce))
                    at = check_resume(self.secret, self.btid, nonce, _recv_exact(sock, RESUME.size))
                except BaseException:
                    sock.close()
                    raise
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with self.cv:
                    if gen != self.down_gen:
                        sock.close()
                        return None
                    first = self.frames[0][0] if self.frames else self.got
                    if at < first:  # (one ahead of this member is fed once this member gets there)
                        sock.close()
                        self.say(
                            "downfail", to=index, why=f"it resumes at byte {at}, which this member no longer holds"
                        )
                        return None
                    self.down = sock
                    self.sent = at
                    self.acked = min(self.acked, at)
                    self.cv.notify_all()
                if again:
                    self.resent += 1
                    self.say("resend", to=index, at=at)
                return sock
            except (OSError, Refused, EOFError, struct.error) as exc:
                why = str(exc) or type(exc).__name__
                time.sleep(0.2 * (attempt + 1))
        self.say("downfail", to=index, why=why)
        return None

    def _forward(self, gen: int) -> None:
        """Feed the successor of generation `gen` until it (and every member after it) holds the
        whole stream; dial it again after a broken connection (a bad chunk, a reset) while each
        attempt makes progress."""
        failures, again = 0, False
        while failures < RECONNECTS:
            sock = self._dial(gen, again)
            again = True
            if sock is None:
                return
            with self.cv:
                before = self.acked
            threading.Thread(target=self._acks_down, args=(sock, gen), daemon=True).start()
            if self._send(sock, gen):
                return
            with self.cv:
                if gen != self.down_gen or self.aborted:
                    return
                failures = 0 if self.acked > before else failures + 1
        with self.cv:
            to = self.down_to[2] if self.down_to else -1
        self.say("downfail", to=to, why=f"the connection broke {RECONNECTS} times without progress")

    def _send(self, sock: socket.socket, gen: int) -> bool:
        """Forward frames; True once the successor holds the whole stream (or is no longer this
        member's), False when the connection broke."""
        while True:
            with self.cv:
                while not self.aborted and gen == self.down_gen and self.down is sock and self.sent >= self.got:
                    if self.total and self.acked >= self.total:
                        return True
                    self.cv.wait(1.0)
                if self.aborted or gen != self.down_gen:
                    return True
                if self.down is not sock:
                    return False
                frame = self._frame_at(self.sent)
            if frame is None:
                self.say(
                    "downfail",
                    to=self.down_to[2] if self.down_to else -1,
                    why=f"offset {self.sent} is no longer held here",
                )
                return True
            if self.flip:
                self.flip = False
                frame = frame[:-1] + bytes([frame[-1] ^ 0xFF])
            try:
                sock.sendall(frame)
            except OSError:
                with self.cv:
                    if self.down is sock:
                        self.down = None
                _close(sock)
                return False
            with self.cv:
                if self.down is sock:
                    self.sent += len(frame) - HEADER
                self.cv.notify_all()

    def _frame_at(self, offset: int) -> bytes | None:
        for at, frame in self.frames:  # the frames are few: a window's worth at most
            if at == offset:
                return frame
            if at > offset:
                break
        return None

    def _acks_down(self, sock: socket.socket, gen: int) -> None:
        reader = sock.makefile("rb", buffering=0)
        try:
            while True:
                kind = reader.read(1)
                if kind != b"A":
                    break
                at = check_ack(self.secret, self.btid, read_exact(reader.read, ACK.size))
                with self.cv:
                    if self.down is not sock:
                        return
                    self.acked = at
                    self._trim()
                    self.cv.notify_all()
        except (OSError, Refused, EOFError, struct.error):
            pass
        with self.cv:
            if self.down is sock:
                self.down = None
            self.cv.notify_all()
        _close(sock)

    def _trim(self) -> None:
        low = self._low()
        while self.frames and self.frames[0][0] + len(self.frames[0][1]) - HEADER <= low:
            self.frames.popleft()

    # ------------------------------------------------------------------ the sink

    def start_sink(self, go: dict) -> None:
        """The sink, from the frames already held; a `go` that names a successor keeps them for it
        from now on (`connect` follows: its predecessor may have sent frames before this `go`)."""
        with self.cv:
            self.total = go["total"]
            if go.get("next"):
                self.tail = False
        if go.get("write", True):
            self.sink = FileSink(self.cfg, go) if self.cfg["mode"] == "files" else ImageSink(self.cfg)
            try:
                self.sink.prepare()
            except OSError as exc:
                self._sink_failed(exc)
        threading.Thread(target=self._sink_loop, daemon=True).start()

    def _sink_failed(self, exc: BaseException) -> None:
        sink = self.sink
        with self.cv:
            if sink is not None and sink.failed:
                return  # said already (the stall judge ended it: this is its write failing)
            if sink is not None:
                sink.failed = str(exc)
        if sink is not None:
            sink.abort()
        self.say("sinkfail", at=self.sunk, why=_said(exc), err=sink.said() if isinstance(sink, ImageSink) else "")

    def judge_sink(self) -> None:
        """An image's load that took no byte for `stall_s`, or did not finish within `finish_s` of
        its last, is ended, said (`stalled`: where it stopped; `finishing`: after every byte), and
        the member goes on relaying without it."""
        sink = self.sink
        with self.judging:
            with self.cv:
                if not isinstance(sink, ImageSink) or sink.failed or self.stall_s is None:
                    return
                now = time.monotonic()
                if self.finishing is not None:
                    limit = finish_s(self.stall_s, self.total)
                    if now - self.finishing < limit:
                        return
                    why = f"load took every byte and did not finish within {limit:.0f} s"
                else:
                    since = self.writing
                    if since is None or now - max(since, sink.took_at) < self.stall_s:
                        return
                    why = f"load took no byte for {self.stall_s:.0f} s"
                sink.failed = why
                at = sink.written
                finishing = self.finishing is not None
            sink.abort()
            self.say("sinkfail", at=at, why=why, err=sink.said(), stalled=True, finishing=finishing)

    def _sink_loop(self) -> None:
        while True:
            with self.cv:
                while self.sunk >= self.got and self.sunk < self.total and not self.aborted:
                    if self.wait != "down":
                        self.wait = "up"
                    self.cv.wait(1.0)
                if self.aborted:
                    return
                if self.sunk >= self.total:
                    break
                frame = self._frame_at(self.sunk)
                self.wait = "sink"
            assert frame is not None
            sink = self.sink
            if sink is not None and not sink.failed:
                with self.cv:
                    self.writing = time.monotonic()
                try:
                    sink.write(self.sunk, memoryview(frame)[HEADER:])
                except OSError as exc:
                    self._sink_failed(exc)
                with self.cv:
                    self.writing = None
            with self.cv:
                self.sunk += len(frame) - HEADER
                self._trim()
                self.cv.notify_all()
        report: dict[str, object] = {}
        sink = self.sink
        if sink is not None and not sink.failed:
            with self.cv:
                self.finishing = time.monotonic()
            try:
                report = sink.end()
            except OSError as exc:
                self._sink_failed(exc)
            else:
                self.say("done", **report)
        elif sink is None:
            self.say("done", relayed=True)
        with self.judging:  # a load the judge is ending: its word comes before this member's end
            pass
        with self.cv:
            self.sink_done = True
            self.cv.notify_all()

    # ------------------------------------------------------------------ the end

    def over(self) -> bool:
        """Everything held here and, downstream, by every member after this one."""
        return self.sink_done and self.got >= self.total and (self.tail or self.acked >= self.total)

    def abort(self, why: str) -> None:
        with self.cv:
            if self.aborted:
                return
            self.aborted = why
            self.cv.notify_all()
        if self.sink is not None:
            self.sink.abort()

    def status(self) -> dict:
        with self.cv:
            return {
                "got": self.got,
                "sunk": self.sunk,
                "sent": self.sent,
                "acked": self._ack_value(),
                "low": self._low(),
                "wait": self.wait if self.got < self.total or not self.sink_done else "-",
                "tail": self.tail,
                "t": time.monotonic(),
                "span": self.last_t - self.first_t if self.first_t is not None else 0.0,
            }


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = sock.recv(n - len(data))
        if not more:
            raise EOFError("the connection closed")
        data += more
    return data


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _said(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def read_ctrl(read: Callable[[int], bytes]) -> dict:
    (length,) = CTRL.unpack(read_exact(read, CTRL.size))
    if length > MAX_CTRL:
        raise Refused(f"a command of {length} bytes")
    message = json.loads(read_exact(read, length).decode())
    if not isinstance(message, dict):
        raise Refused("a command that is not an object")
    return message


def controller(relay: Relay, read: Callable[[int], bytes], say: Say) -> None:
    """The commands (and, for the head, the data) on stdin, until it ends."""
    try:
        while True:
            kind = read(1)
            if not kind:
                relay.abort("the controller closed the connection")
                return
            relay.heard = time.monotonic()
            if kind == b"D":
                relay.take(read, 0)
                continue
            if kind != b"C":
                raise Refused(f"a frame of kind {kind!r} from the controller")
            message = read_ctrl(read)
            op = message.get("op")
            if op == "next":
                relay.connect(message["host"], int(message["port"]), int(message["index"]))
            elif op == "tail":
                relay.become_tail()
            elif op == "abort":
                relay.abort(message.get("why") or "aborted by the controller")
                return
    except (Refused, OSError, EOFError, ValueError, KeyError, struct.error) as exc:
        say("error", why="from the controller: " + _said(exc))
        relay.abort("the controller's stream broke")


def heartbeat(relay: Relay, say: Say, every: float, silence: float) -> None:
    while True:
        time.sleep(every)
        if time.monotonic() - relay.heard > silence:
            say("error", why=f"no word from the controller for {silence:.0f} s")
            relay.abort("the controller went silent")
            return
        relay.judge_sink()
        say("at", **relay.status())


def main() -> int:
    began = time.monotonic()
    say = Say()
    read = sys.stdin.buffer.read
    try:
        kind = read(1)
        if kind != b"C":
            raise Refused("no configuration")
        cfg = read_ctrl(read)
        relay = Relay(cfg, say)
        port = relay.listen()
        say("ready", port=port, pid=os.getpid(), began=began, t=time.monotonic(), **relay.scan())
        kind = read(1)
        if kind != b"C":
            raise Refused("no decision after the scan")
        go = read_ctrl(read)
    except (Refused, OSError, EOFError, ValueError, KeyError, struct.error) as exc:
        say("error", why=_said(exc))
        return 2
    if go.get("op") != "go":
        return 0  # skipped: this node holds it already, or the controller gave up
    relay.heard = time.monotonic()
    relay.start_sink(go)
    after = go.get("next")
    if after:
        relay.connect(after["host"], int(after["port"]), int(after["index"]))
    threading.Thread(target=controller, args=(relay, read, say), daemon=True).start()
    threading.Thread(
        target=heartbeat, args=(relay, say, cfg.get("heartbeat_s", 0.5), cfg.get("silence_s", 30.0)), daemon=True
    ).start()
    with relay.cv:
        while not relay.over() and not relay.aborted:
            relay.cv.wait(1.0)
        deadline = time.monotonic() + HANDSHAKE_S  # the predecessor hears that everything arrived
        while relay.up is not None and relay.acked_up < relay.total and time.monotonic() < deadline:
            relay.cv.wait(0.1)
    if relay.aborted:
        if relay.sink is not None:
            relay.sink.abort()
        say("error", why=relay.aborted)
        return 3
    say("at", **relay.status())
    say("bye", resent=relay.resent)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # its threads may still block in reads: no interpreter shutdown to wait on them
