"""A stand-in for `docker`/`podman` where a real runtime is not needed: it records every call and
keeps its containers in a JSON file, so a test sees what a stop left behind.

`run`: registers a container (its --name and --label values, the whole argv), then waits like a
job; SIGTERM (what `docker run` proxies to its container) ends it and, with --rm, removes it; a
SIGKILL of the client leaves it registered, as a real container outlives its killed client.
`rm -f [--] NAME|ID...`, `ps -aq [--no-trunc] --filter label=K=V...`, `ps -a --filter ... --format ...`
as the runtimes answer them; `exec [-e K=V]... ID CMD` runs CMD on this host (a killed client
leaves it running, as a real one does); `image inspect` as for an image every node holds
(`FAKE_IMAGE_ID`). Install with `install(dir, state)`: a `docker` and a `podman` on PATH."""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.node.procs import proc_start_time

FAKE_IMAGE_ID = "f" * 64
"""What `image inspect` answers for any image (the preflight's image row: one ID on every node)."""
VALUED = {
    "--name",
    "--label",
    "-v",
    "-w",
    "-e",
    "--user",
    "--network",
    "--ipc",
    "--ulimit",
    "--device",
    "--cap-add",
    "--gpus",
    "--tmpfs",
    "--pull",
}


def install(bin_dir: Path, state: Path, execute: bool = False) -> Path:
    """`docker` and `podman` shims in `bin_dir` that run this file on `state`; returns the calls log.
    `execute`: `run` runs the command after the image on this host (the image's python being one of
    this machine's), in a session of its own as a container's processes are: SIGTERM to the client
    is passed on, a killed client leaves it running, `rm -f` kills it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("docker", "podman"):
        shim = bin_dir / name
        flag = "FAKE_RUNTIME_EXEC=1 " if execute else ""
        shim.write_text(f'#!/bin/sh\n{flag}exec {sys.executable} {__file__} {state} {name} "$@"\n')
        shim.chmod(0o755)
    state.write_text("[]")
    return state.with_suffix(".calls")


def _kill(box: dict[str, Any]) -> None:
    """`rm -f` of a container: SIGKILL to its process group, if that is still the container's. The
    container's process may have ended long ago (its killed client never removed it), and its pid
    be another process's now, even this `rm`'s own (a busy machine reuses pids within seconds)."""
    pgid = box.get("pgid")
    if pgid and box.get("started") is not None and proc_start_time(pgid) == box["started"]:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def containers(state: Path) -> list[dict[str, Any]]:
    """The containers as they are now: read without the lock, which `_edit`'s atomic replace allows."""
    return list(json.loads(state.read_text()))


def _edit(state: Path, fn: Any) -> Any:
    """Apply `fn` to the containers under the lock, and replace the file whole: a reader without
    the lock (a test's `containers`) sees the old list or the new one, never an empty file."""
    with open(state.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(state.read_text())
        out = fn(data)
        tmp = state.with_name(f".{state.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, state)
        return out


def main(argv: list[str]) -> int:
    state, runtime, cmd, args = Path(argv[0]), argv[1], argv[2], argv[3:]
    with open(state.with_suffix(".calls"), "a") as fh:
        fh.write(json.dumps([runtime, cmd, *args]) + "\n")
    if cmd == "run":
        name, labels, i = None, {}, 0
        while i < len(args) and args[i].startswith("-"):
            if args[i] in VALUED:
                if args[i] == "--name":
                    name = args[i + 1]
                elif args[i] == "--label":
                    k, _, v = args[i + 1].partition("=")
                    labels[k] = v
                i += 2
            else:
                i += 1
        cid = secrets.token_hex(32)  # a whole ID, as `ps -q --no-trunc` prints it
        box = {"id": cid, "name": name or cid, "labels": labels, "argv": [runtime, cmd, *args], "state": "running"}

        def register(data: list[dict[str, Any]]) -> bool:
            if any(c["name"] == box["name"] for c in data):
                return False
            data.append(box)
            return True

        if not _edit(state, register):
            print(f'Error: the container name "{name}" is already in use', file=sys.stderr)
            return 125
        done: list[int] = []
        code = 143
        if os.environ.get("FAKE_RUNTIME_EXEC"):
            workdir = args[args.index("-w") + 1] if "-w" in args[:i] else None
            child = subprocess.Popen(args[i + 1 :], cwd=workdir, start_new_session=True)
            box.update(pgid=child.pid, started=proc_start_time(child.pid))
            _edit(
                state, lambda data: [c.update(pgid=child.pid, started=box["started"]) for c in data if c["id"] == cid]
            )
            signal.signal(signal.SIGTERM, lambda *_: os.killpg(child.pid, signal.SIGTERM))
            code = child.wait()
        else:
            signal.signal(signal.SIGTERM, lambda *_: done.append(1))
            print(f"container {name} running {' '.join(args[i:])}", flush=True)
            while not done:
                time.sleep(0.05)
        if "--rm" in args:
            _edit(state, lambda data: data.__setitem__(slice(None), [c for c in data if c["id"] != cid]))
        return code if code >= 0 else 128 - code
    if cmd == "rm":
        wanted = [a for a in args if not a.startswith("-")]

        def remove(data: list[dict[str, Any]]) -> list[str]:
            gone = [c for c in data if c["id"] in wanted or c["name"] in wanted]
            for c in gone:
                _kill(c)
            data[:] = [c for c in data if c not in gone]
            return [w for w in wanted if not any(w in (c["id"], c["name"]) for c in gone)]

        missing = _edit(state, remove)
        for w in missing:
            print(f'Error: no container with name or ID "{w}" found', file=sys.stderr)
        return 1 if missing else 0
    if cmd == "ps":
        filters = [args[i + 1].removeprefix("label=") for i, a in enumerate(args) if a == "--filter"]
        rows = [
            c
            for c in containers(state)
            if all(
                f"{k}={c['labels'].get(k)}" in filters or not any(f.startswith(k + "=") for f in filters)
                for k in c["labels"]
            )
            and all(f.partition("=")[0] in c["labels"] for f in filters)
        ]
        for c in rows:
            if "--format" in args:
                print(f"{c['id']}\t{c['name']}\t{c['labels'].get('orch.run', '')}\t{c['state']}")
            else:
                print(c["id"])
        return 0
    if cmd == "exec":  # `exec [-e K=V]... ID CMD...`: CMD on this host; a killed client leaves it running
        env, i = dict(os.environ), 0
        while i < len(args) and args[i].startswith("-"):
            if args[i] in ("-e", "--env"):
                key, _, value = args[i + 1].partition("=")
                env[key] = value
                i += 2
            else:
                i += 1
        if not any(args[i] in (c["id"], c["name"]) for c in containers(state)):
            print(f"Error: no container with name or ID {args[i]} found", file=sys.stderr)
            return 125
        env.pop("FAKE_RUNTIME_EXEC", None)
        late = Path(str(state) + ".exec-late")  # the next exec starts its command that many seconds late, once
        if late.exists():
            delay = float(late.read_text())
            late.unlink()
            time.sleep(delay)
        return subprocess.call(args[i + 1 :], env=env)
    if cmd == "image" and args[:1] == ["inspect"]:  # every node holds the image, under one ID
        print(f'sha256:{FAKE_IMAGE_ID}\t["PATH=/usr/bin"]')
        return 0
    print(f"fake runtime: {cmd} is not faked", file=sys.stderr)
    return 125


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
