"""`job`: the workdir and the job's files on every node (the same bytes, the same dataset), its
run root, and the job's own verdict on its arguments (`jobcheck`); the job's own problems once,
on the master's row."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from ...config.inventory import Inventory
from ...config.jobenv import JobEnv, job_env
from ...config.nodes import Node
from ...config.plan import world_size
from ...config.trainer import batch_choices, batch_problem, is_builtin_model
from .. import jobcheck
from ..jobargs import is_output_key, job_files, path_args, raw_setting
from ..results import CheckResult, Facts, Findings, NodeFacts, majority, probed
from ..shapes import INT, NUMBER, MapOf, Opt
from .common import no_image

_FILE = {
    "path": str,
    "exists": bool,
    "is_file": bool,
    "is_dir": bool,
    "size": INT,
    "sha256": str,
    "text": Opt(str),
    "error": str,
    "output": bool,
    "writable": bool,
    "ancestor": str,
    "ancestor_is_dir": bool,
    "ancestor_writable": bool,
    "dataset_error": str,
    "dataset": MapOf(
        {"path": str, "files": INT, "bytes": INT, "listing": str, "sample": str, "capped": bool, "error": str}
    ),
}
FACTS = {
    "job_check": Opt({"kind": str, "rc": Opt(INT), "out": str, "err": str, "seconds": NUMBER, "error": str}),
    "paths": MapOf(_FILE),
    "paths_inside": Opt({"paths": MapOf({"path": str, "exists": bool, "is_file": bool, "is_dir": bool}), "error": str}),
    "workdir": Opt(_FILE),
    "run_root": Opt({"path": str, "problem": Opt(str)}),
}
"""The probe's facts this check reads: the job's own check, its files and output folders where the
node's host has them (through the container's mounts), the inputs that are in the image's own
files as the job's container sees them (`paths_inside`), its workdir, and what the agent would say
of a run directory under job.run_root."""


def cluster_job_findings(inv: Inventory, said: str = "") -> list[tuple[str, str, str]]:
    """Problems of the job itself (not of a node), reported once, on the master's row; one the
    job's own check already `said` (the trainer's refusal, made with the same rule) is not
    repeated."""
    out = []
    ws = world_size(inv.nodes)
    raw = raw_setting(inv, "batch")
    batch = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    problem = batch_problem(batch, ws) if batch is not None else None
    if batch is not None and problem and problem not in said:
        out.append(
            (
                "fail",
                f"cluster-wide: {problem} ({len(inv.nodes)} nodes × {inv.nodes[0].nproc_per_node})",
                f"use a multiple of {ws}: {' or '.join(map(str, batch_choices(batch, ws)))}",
            )
        )
    elif batch is not None and batch < 0 and "batch" not in said:
        out.append(
            (
                "fail",
                f"cluster-wide: batch {batch} (auto-batch) does not work with DDP",
                f"give a global batch that divides by {ws}",
            )
        )
    base = inv.job.workdir or "<workdir>"
    for key, value in relative_args(inv).items():
        out.append(
            (
                "fail",
                f"cluster-wide: {key}: {value!r} is a relative path; torchrun workers resolve it "
                "against their own working directory, which differs per node",
                f"use an absolute path, e.g. {key}: {os.path.normpath(os.path.join(base, value))}",
            )
        )
    return out


def relative_args(inv: Inventory) -> dict[str, str]:
    """The path-like job arguments that are relative (so no node's copy is checked)."""
    return {
        key: value for key, value in path_args(inv).items() if not (_is_absolute(value) or _builtin_model(key, value))
    }


def _is_absolute(path: str) -> bool:
    return path.startswith(("/", "~/"))


def _builtin_model(key: str, value: str) -> bool:
    """`model: yolo12m.yaml`, `cfg: yoloe-v8l-seg.yaml` name a model config shipped with ultralytics,
    not a file (the trainer's rule, `config/trainer.is_builtin_model`)."""
    return is_builtin_model(key.replace("-", "_"), value)


def check_job(inv: Inventory, facts: Facts) -> list[CheckResult]:
    """Workdir and the job's files on every node; the job's own verdict on its arguments
    (`jobcheck`: the trainer's `--check` on the master, or whether `job.module` imports); what is
    wrong with the job as a whole once, on the master's row, and every other row says what it
    checked, never more."""
    nodes = probed(inv, facts)
    paths = {k: v for k, v in job_files(inv).items() if _is_absolute(v)}
    digests = {key: {n.name: _digest((nf.raw.get("paths") or {}).get(key) or {}) for n, nf in nodes} for key in paths}
    answers = {n.name: jobcheck.read(inv, n, nf.raw.get("job_check")) for n, nf in nodes}
    master_answer = answers.get(inv.master.name)
    said = master_answer.detail if master_answer is not None and master_answer.status == "fail" else ""
    relative = relative_args(inv)
    sync, workdir, master = inv.job.sync, inv.job.workdir, inv.master.name
    own_check = jobcheck.kind(inv) is not None
    out = []
    for node, nf in nodes:
        f = Findings("job", node.name)
        env = job_env(inv, node)
        if node.name == inv.master.name:
            for item in cluster_job_findings(inv, said):
                f.add(*item)
        wd = nf.raw.get("workdir")
        if inv.job.workdir and wd is not None and not wd.get("is_dir"):
            f.add(
                "fail",
                f"workdir {inv.job.workdir} does not exist"
                if not wd.get("exists")
                else f"workdir {inv.job.workdir} is not a directory",
                _SYNC_HINT
                if synced(sync, inv.job.workdir)
                else "create it or mount the shared filesystem on this node",
            )
        root = nf.raw.get("run_root") or {}
        if root.get("problem"):
            f.add(
                "fail",
                f"job.run_root {inv.job.run_root}: the node agent would refuse its run directory: {root['problem']}",
                "a run directory, and every directory above it, must be writable by its owner only",
            )
        for key, path in paths.items():
            host = path if key.startswith("sync[") or not path.startswith("/") else env.host_path(path)
            if host is None:  # under no mount: in the image's own files
                _judge_inside(key, path, env, nf, f)
                continue
            shown = path if host == path else f"{path} ({host} on the host)"
            p = (nf.raw.get("paths") or {}).get(key) or {}
            if is_output_key(key) and env.apart and inv.job.container is not None and inv.job.container.user != "host":
                p = {k: v for k, v in p.items() if "writable" not in k}  # its user's: the container row, inside
            _judge_path(key, shown, p, digests[key], node, f, synced(sync, path))
            if key.replace("-", "_") == "data":
                _judge_dataset(shown, node.name, datasets(nodes, key), f, synced(sync, path))
        answer = answers.get(node.name)
        gone = no_image(inv, nf)
        if gone and jobcheck.checks_on(inv, node):
            f.add("skip", f"the job's own check {gone}")
        elif answer is not None and nf.python_fallback:  # the software row says why; once is enough
            f.add(
                "warn",
                f"the job's own check could not run: job.python {node.python} does not work here (see the "
                "software check)",
            )
        elif answer is not None:
            f.add(answer.status, answer.detail, answer.hint)
            kept = (answer.answer or {}).get("out")
            lost = any("is inside the container only" in d for _s, d, _h in f.items)  # its folder said so
            if (
                answer.status == "ok"
                and isinstance(kept, str)
                and kept.startswith("/")
                and not lost
                and not kept_on_host(env, kept)
            ):
                f.add(
                    "fail",
                    f"the trainer would write its run to {kept}, inside the container only ({_gone(env)})",
                    "write it under a mount: give project: a folder under one of job.container.mounts (e.g. "
                    "mount - /mnt/nfs/ckpt:/ckpt and give project: /ckpt/<name>)",
                )
        elif jobcheck.checks_on(inv, node) and "job_check" not in nf.raw:
            f.add(
                "warn",
                "the probe brought back no answer from the job's own check: the job's arguments are not verified",
                "run orch check -v to see the probe's command",
            )
        f.value = f"world size {world_size(inv.nodes)}, {len(paths)} file(s)"
        checked = _job_checked(workdir, master, own_check, node.name, paths, relative, answer)
        out.append(f.result(checked + _datasets_checked(nodes, node, paths)))
    return out


def kept_on_host(env: JobEnv, path: str) -> bool:
    """What the job writes at `path` outlives its container: on the bare host, or under a mount; a
    runtime that keeps no container of its own (apptainer) writes the host's files or fails."""
    return env.host_path(path) is not None or env.runtime is None or not env.runtime.keeps_containers


def _gone(env: JobEnv) -> str:
    rt = env.runtime
    return f"under no mount: {' '.join(rt.run[:3]) if rt else ''} deletes it with the container when the job ends"


def _judge_inside(key: str, path: str, env: JobEnv, nf: NodeFacts, f: Findings) -> None:
    """A path of the job's under none of its container's mounts: an output is lost with the
    container (issue 54.1); an input must be in the image (as the job's container saw it)."""
    if is_output_key(key):
        if not kept_on_host(env, path):
            f.add(
                "fail",
                f"{key}: {path} is inside the container only ({_gone(env)}): the run would write its checkpoints "
                "there and lose them",
                f"mount it: e.g. - /mnt/nfs/ckpt:/ckpt in job.container.mounts and {key}: /ckpt/<name>",
            )
        return
    seen = (nf.raw.get("paths_inside") or {}).get("paths", {}).get(key)
    if not isinstance(seen, Mapping):
        return  # nothing ran in the image here: its rows say so once
    if not seen.get("exists"):
        f.add(
            "fail",
            f"{key}: {path} is under none of job.container.mounts and not in the image on this node",
            "mount the folder that holds it (job.container.mounts: HOST:CONTAINER), or fix the path",
        )
    elif not seen.get("is_file") and key.replace("-", "_") in ("weights", "data", "script"):
        f.add("fail", f"{key}: {path} is not a file (in the image)")


def _datasets_checked(nodes: list[tuple[Node, NodeFacts]], node: Node, paths: Mapping[str, str]) -> str:
    """What an `ok` job row says of the dataset comparison."""
    for key in (k for k in paths if k.replace("-", "_") == "data"):
        listed = datasets(nodes, key)
        mine = listed.get(node.name)
        if mine and len(listed) > 1:
            splits = ", ".join(f"{s} {_split_text(d)}" for s, d in mine.items() if " " not in s)
            return f"; what {paths[key]} lists ({splits}) the same on every node"
    return ""


def _job_checked(
    workdir: str | None,
    master: str,
    own_check: bool,
    node: str,
    paths: Mapping[str, str],
    relative: Mapping[str, str],
    answer: jobcheck.JobAnswer | None,
) -> str:
    """What an `ok` job row verified on `node`, and what it did not (`own_check`: the job has a
    check of its own, which runs on the `master`)."""
    what = ([f"workdir {workdir}"] if workdir else []) + (
        [f"{len(paths)} file(s) ({', '.join(paths)})"] if paths else []
    )
    text = (" and ".join(what) + " in place and identical on every node") if what else "no file arguments to check"
    if relative and node != master:
        text += f"; not checked on any node: {', '.join(relative)} (relative path: cluster-wide, on {master}'s row)"
    if answer is None and own_check and node != master:
        text += f"; the job's own check runs on {master}"
    return text


def _digest(p: Mapping[str, Any]) -> tuple[Any, ...]:
    return (p.get("exists"), p.get("size"), p.get("sha256"))


_SYNC_HINT = "it is under job.sync: orch sync copies it to every node (orch up does before its preflight)"


def synced(sync: Sequence[str], path: str) -> bool:
    """`path` is one of `sync` (`job.sync`) or inside one of its directories."""
    return any(path == s or path.startswith(s + "/") for s in sync)


def _judge_path(
    key: str,
    path: str,
    p: Mapping[str, Any],
    digests: Mapping[str, tuple[Any, ...]],
    node: Node,
    f: Findings,
    in_sync: bool = False,
) -> None:
    if is_output_key(key):
        _judge_output(key, path, p, node, f)
        return
    if not p.get("exists"):
        f.add(
            "fail",
            f"{key}: {path} does not exist on this node",
            _SYNC_HINT if in_sync else "copy it there (scp/rsync) or put it on a filesystem every node mounts",
        )
        return
    if not p.get("is_file"):
        if key.replace("-", "_") in ("weights", "data", "script"):
            f.add("fail", f"{key}: {path} is not a file")
        return
    common_any, count, unique = majority(digests)
    common: tuple[Any, ...] = tuple(common_any)  # type: ignore[arg-type]
    mine = _digest(p)
    if len(digests) > 1 and mine != common and unique:
        f.add(
            "fail",
            f"{key}: {path} differs from the majority ({count} nodes): size {p.get('size')} vs "
            f"{common[1]}, sha256 {str(p.get('sha256'))[:12]} vs {str(common[2])[:12]}",
            _SYNC_HINT if in_sync else "sync the file so every node reads the same bytes (rsync -c)",
        )
    if key.replace("-", "_") == "data":
        _judge_data_yaml(path, p, f)


def datasets(nodes: list[tuple[Node, NodeFacts]], key: str) -> dict[str, Mapping[str, Any]]:
    """What the data YAML `key` lists on each node that listed it (the probe's `dataset`)."""
    out = {}
    for n, nf in nodes:
        p = (nf.raw.get("paths") or {}).get(key) or {}
        if isinstance(p.get("dataset"), Mapping):
            out[n.name] = p["dataset"]
    return out


def _split_key(split: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    """What two nodes must agree on for one split: count, bytes, names and sizes, sampled bytes."""
    if split is None:
        return ("absent",)
    if split.get("error"):
        return None
    return (split.get("files"), split.get("bytes"), split.get("listing"), split.get("sample"))


def _split_text(split: Mapping[str, Any] | None) -> str:
    if split is None:
        return "not listed"
    more = "+" if split.get("capped") else ""
    return f"{split.get('files')}{more} files, {_size(split.get('bytes'))}"


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return "? bytes"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _judge_dataset(
    path: str, me: str, listed: Mapping[str, Mapping[str, Any]], f: Findings, in_sync: bool = False
) -> None:
    """The data YAML's splits on this node against every other node's: the same number of files,
    bytes, names and sizes, and sampled bytes (`node/probe.dataset_facts`). A node that differs
    from a unique majority fails, naming the split; with no majority every node that differs fails."""
    mine = listed.get(me)
    if mine is None or len(listed) < 2:
        return
    hint = (
        _SYNC_HINT
        if in_sync
        else "copy the dataset again so every node holds the same files (rsync -a --delete from the good copy), "
        "or put it on storage every node mounts"
    )
    for split in sorted({s for d in listed.values() for s in d}, key=lambda s: (s.split()[0] != "train", s)):
        here = mine.get(split)
        if here is not None and here.get("error"):
            f.add("warn", f"data: {split} ({here.get('path')}) not compared with the other nodes: {here['error']}")
            continue
        keys = {n: _split_key(d.get(split)) for n, d in listed.items()}
        keys = {n: k for n, k in keys.items() if k is not None}
        if len(set(keys.values())) < 2 or me not in keys:
            continue
        common, count, unique = majority(keys)
        if keys[me] == common and unique:
            continue
        at = f" ({here.get('path')})" if here is not None else ""
        if unique:
            other = next(d.get(split) for n, d in listed.items() if keys.get(n) == common)
            same = (
                "; the same count and size, but other names or contents"
                if here is not None
                and other is not None
                and (here.get("files"), here.get("bytes")) == (other.get("files"), other.get("bytes"))
                else ""
            )
            f.add(
                "fail",
                f"data: the {split} split of {path}{at} differs here from the other nodes: {_split_text(here)} "
                f"here, {_split_text(other)} on {count} node(s){same}",
                hint,
            )
        else:
            others = ", ".join(f"{n}: {_split_text(d.get(split))}" for n, d in listed.items() if n != me)
            f.add(
                "fail",
                f"data: the {split} split of {path}{at} differs between the nodes (no majority): "
                f"{_split_text(here)} here; {others}",
                hint,
            )


def _judge_output(key: str, path: str, p: Mapping[str, Any], node: Node, f: Findings) -> None:
    """An output directory is fine when it is a writable directory or can be created."""
    who = node.ssh.user or "the ssh user"
    if p.get("exists") and not p.get("is_dir"):
        f.add("fail", f"{key}: {path} exists and is not a directory", "point it at a directory, or remove the file")
    elif p.get("is_dir") and p.get("writable") is False:
        f.add("fail", f"{key}: {path} is not writable by {who}", f"chown/chmod it, or pick a directory {who} owns")
    elif not p.get("exists") and p.get("ancestor_writable") is False:
        anc = p.get("ancestor") or "/"
        why = f"{anc} is not writable by {who}" if p.get("ancestor_is_dir", True) else f"{anc} is a file"
        f.add(
            "fail",
            f"{key}: {path} cannot be created: {why}",
            f"create {path} on this node with the right owner, or write under a directory {who} owns",
        )


def _judge_data_yaml(path: str, p: Mapping[str, Any], f: Findings) -> None:
    text = p.get("text")
    if text is None:
        return
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        f.add("fail", f"data: {path} is not valid YAML: {str(exc).splitlines()[0]}")
        return
    names = doc.get("names") if isinstance(doc, dict) else None
    if not names:
        f.add(
            "fail",
            f"data: {path} has no `names` (class names)",
            "add names: {0: person, 1: car, ...} (ultralytics refuses a dataset without them)",
        )
        return
    nc = doc.get("nc")
    if isinstance(nc, int) and nc != len(names):
        f.add("fail", f"data: {path} says nc: {nc} but lists {len(names)} names")
