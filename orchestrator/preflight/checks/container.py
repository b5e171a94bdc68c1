"""`container`: with job.container, no container of this cluster's runs left on a node, the image
there and the same on every node, its CUDA within the driver's, and what the job finds inside
the container (/dev/shm, the GPUs, its python, its output folders, memlock and the verbs devices)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ...config.container import Container
from ...config.inventory import Inventory
from ...config.runtimes import HeldImage, Runtime, runtime
from .. import cudacompat
from ..results import CheckResult, Facts, Findings, NodeFacts, majority, probed
from ..shapes import RUN, MapOf, Opt
from .common import fold_names

FACTS = {
    "containers": Opt(RUN),
    "container_image": Opt(RUN),
    "outputs_inside": Opt({"paths": MapOf({"checked": str, "writable": bool}), "error": str}),
    "container_start": Opt(RUN),
}
"""The probe's facts this check reads: the leftover containers, the image the node holds, the
job's output folders as seen inside the container, and what the runtime said where nothing ran
inside it (`container_start`)."""


def check_container(inv: Inventory, facts: Facts) -> list[CheckResult]:
    """`job.container`: no container of this cluster's orch runs is left on a node (it would hold
    the GPUs and the master port, and a launch of its run would collide with its name), the image
    there, and what the job finds inside its container."""
    c = inv.job.container
    nodes = probed(inv, facts)
    if c is None:
        return [
            CheckResult("container", node.name, "skip", "", "the job runs on the host (no job.container)")
            for node, _ in nodes
        ]
    rt = runtime(c.runtime)
    held = {node.name: h for node, nf in nodes if (h := nf.image(rt)) is not None}
    out = []
    for node, nf in nodes:
        f = Findings("container", node.name)
        f.value = rt.name
        leftover_findings(rt, inv.name, nf, f)
        image_findings(c, rt, inv.path, node.name, bool(node.gpus), nf, held, f)
        inside = rt.keeps_containers  # its own /dev/shm, devices, limits and user: worth looking at
        if inside:
            shm_finding(nf, f)
            gpu_finding(rt, bool(node.gpus), node.nproc_per_node, nf, f)
        if not (inside and python_finding(c, nf, f)) and not start_finding(rt, bool(inv.checks.rdma_devices), nf, f):
            outputs_finding(c, nf, f)
        if inside and inv.checks.rdma_devices:
            rdma_finding(nf, f)
        out.append(f.result())
    return out


def leftover_findings(rt: Runtime, cluster: str, nf: NodeFacts, f: Findings) -> None:
    """The containers of this cluster's runs still on the node (the probe's `containers` listing)."""
    listing = nf.raw.get("containers")
    if not rt.ps:
        f.add("ok", f"{rt.name}: no daemon keeps a container; nothing outlives the job's processes")
    elif not listing:
        f.add("skip", "the leftover containers were not listed (a probe without that fact)")
    elif listing.get("rc") != 0:
        said = (listing.get("err") or "").strip().splitlines()
        f.add(
            "fail",
            f"`{' '.join(rt.ps)}` does not answer: {said[-1] if said else 'exit ' + str(listing.get('rc'))}",
            f"install {rt.name} on this node and let the SSH user run it ({rt.name} info), or fix "
            "job.container.runtime",
        )
    else:
        left = [line.split("\t") for line in (listing.get("out") or "").splitlines() if line.strip()]
        for row in left:
            name = row[1] if len(row) > 1 else row[0]
            run = row[2] if len(row) > 2 and row[2] else "?"
            state = row[3] if len(row) > 3 else "?"
            rm = " ".join([*rt.rm, name])
            f.add(
                "fail",
                f"container {name} of run {run} is still here ({state}): it holds its GPUs and ports",
                f"orch down {run} (or {rm})" if run != "?" else rm,
            )
        if not left:
            f.add("ok", f"no container of {cluster}'s runs left on this node")


REQUIRE_CUDA = "NVIDIA_REQUIRE_CUDA"
"""An image's environment variable with the CUDA it requires (`cuda>=12.1 brand=...`), which NVIDIA's
container toolkit enforces at the start."""


def required_cuda(env: Mapping[str, str]) -> str | None:
    """The CUDA version an image requires (its `REQUIRE_CUDA`'s `cuda>=`), or None."""
    return next((w.removeprefix("cuda>=") for w in env.get(REQUIRE_CUDA, "").split() if w.startswith("cuda>=")), None)


def image_cuda(env: Mapping[str, str]) -> str | None:
    """The CUDA version an image is built for: what it requires (`required_cuda`), else
    `CUDA_VERSION` (12.1.0), as NVIDIA's container toolkit reads them; None when it says neither."""
    return required_cuda(env) or env.get("CUDA_VERSION") or None


def image_findings(
    c: Container,
    rt: Runtime,
    inventory: str,
    node: str,
    gpus: bool,
    nf: NodeFacts,
    held: Mapping[str, HeldImage],
    f: Findings,
) -> None:
    """The image rows of the container check on one node: the image is here (or `pull: missing`
    lets the launch pull it), it is the image ID the other nodes hold (a tag that moved on one node
    runs another image there: another NCCL, a hang), and the node's driver runs the image's CUDA."""
    mine = held.get(node)
    if mine is None:
        return
    key = "job.container.image"
    if mine.error is not None:
        f.add(
            "fail",
            f"could not ask {rt.name} for {c.image}: {mine.error}",
            mine.fix or f"install {rt.name} on this node and let the SSH user run it ({rt.name} info)",
        )
        return
    if mine.image_id is None:
        if c.pull == "missing" and rt.pulls:
            f.add(
                "warn",
                f"{c.image} is not on this node: the launch pulls it (job.container.pull: missing)",
                f"or put it there first: orch image push {c.image} {inventory}",
            )
        else:
            f.add(
                "fail",
                f"{c.image} is not on this node ({key})",
                f"orch image push {c.image} {inventory} (no registry needed)"
                + (", or set job.container.pull: missing" if rt.pulls else ""),
            )
        return
    ids = {name: h.image_id for name, h in held.items() if h.image_id is not None}
    common, count, unique = majority(ids)
    short = mine.image_id[:12]
    if mine.image_id != common or not unique:
        others = sorted({i for i in ids.values() if i != mine.image_id})
        where = ", ".join(f"{i[:12]} on {fold_names(n for n, x in ids.items() if x == i)}" for i in others)
        f.add(
            "fail",
            f"{c.image} is {short} here but {where}: the name resolves to another image on some nodes "
            "(a tag that moved), and they would run different software",
            f"put one image on every node: orch image push {c.image} {inventory} from a machine that holds "
            f"the right one, or name it by ID in {key}",
        )
        return
    f.add("ok", f"{c.image} is {rt.id_word} {short} on every node that has it ({count})")
    if not gpus:
        return
    facts = nf.gpus
    require = required_cuda(mine.env)
    if require and facts.cuda and cudacompat.version(facts.cuda) < cudacompat.version(require):
        # NVIDIA's container toolkit refuses the start ("unsatisfied condition: cuda>=12.8")
        f.add(
            "fail",
            f"the image requires CUDA {require} or newer (its {REQUIRE_CUDA}); this node's driver "
            f"{facts.driver or '?'} supports CUDA {facts.cuda}: the runtime would refuse to start it",
            f"upgrade the driver on this node, or use an image built for CUDA {facts.cuda} or older",
        )
        return
    cuda = image_cuda(mine.env)
    need = cudacompat.min_driver(cuda) if cuda else None
    if cuda and facts.driver and need and cudacompat.version(facts.driver) < need:
        f.add(
            "fail",
            f"the image is built for CUDA {cuda}, which needs NVIDIA driver {cudacompat.dotted(need)} "
            f"or newer; this node's driver is {facts.driver}",
            "upgrade the driver on this node, or use an image built for an older CUDA",
        )


MIN_SHM = 1 << 30
"""The least /dev/shm a job's container may have: DataLoader workers pass batches through it
("Bus error" below), NCCL its intra-node buffers (`posix_fallocate` failures)."""


def shm_finding(nf: NodeFacts, f: Findings) -> None:
    """/dev/shm inside the job's container as the software facts measured it there (the launch's
    own line): at least `MIN_SHM`. orch shares the host's IPC unless job.container.options say
    `--ipc` or `--shm-size`; this row catches the size those give."""
    size = (nf.raw.get("software") or {}).get("shm_bytes")
    if not isinstance(size, int) or size >= MIN_SHM:
        return
    f.add(
        "fail",
        f"/dev/shm in the container is {size / (1 << 20):.0f} MiB: DataLoader workers die with "
        '"Bus error" and NCCL cannot allocate its shared memory below 1 GiB',
        "leave --ipc and --shm-size out of job.container.options (orch then shares the host's IPC), "
        "or give --shm-size=16g",
    )


_NO_GPU_RUNTIME = ("unresolvable CDI devices", "could not select device driver", "nvidia-container-cli")


def gpu_finding(rt: Runtime, gpus: bool, nproc: int, nf: NodeFacts, f: Findings) -> None:
    """On a GPU node: torch inside the job's container (the `gpus` check's torch facts, gathered in
    the container started as the launch's, with the node's GPUs) sees `nproc_per_node` GPUs; a
    runtime that cannot pass them (no NVIDIA runtime for docker, no CDI spec for podman) is named,
    with its fix (`Runtime.gpu_fix`)."""
    tc = nf.raw.get("torch_cuda")
    if not gpus or not isinstance(tc, dict):
        return
    error = str(tc.get("error") or "")
    if any(k in error for k in _NO_GPU_RUNTIME):
        said = next((ln.strip() for ln in error.splitlines() if any(k in ln for k in _NO_GPU_RUNTIME)), error)
        f.add("fail", f"{rt.name} cannot give the container this node's GPUs: {said}", rt.gpu_fix)
        return
    count = tc.get("device_count")
    if isinstance(count, int) and count != nproc:
        f.add(
            "fail",
            f"torch in the container sees {count} GPU(s), but nproc_per_node is {nproc}: "
            "ranks without a GPU of their own",
            "check the GPUs the container gets (orch up --dry-run shows --gpus/--device), and the NVIDIA "
            f"runtime ({rt.name} info), or set nproc_per_node to {count}"
            if count
            else f"the container got no GPU: check the NVIDIA runtime ({rt.name} info: nvidia) or CDI spec",
        )


_NO_EXEC = re.compile(
    r"permission denied|no such file or directory|not found|exec format error|"
    r"Fatal Python error",
    re.I,
)


def container_user(c: Container) -> str:
    """Who the job runs as inside its container, in a row's words."""
    return {"host": "the SSH user", "root": "root"}.get(c.user, f"uid:gid {c.user}")


def python_finding(c: Container, nf: NodeFacts, f: Findings) -> bool:
    """The job's interpreter could not be run inside the container as its user (the software facts'
    or the output folders' container said so: the exec refused, or the interpreter died before
    its first line): one row naming job.container.python and job.container.user. True when added."""
    said = [
        str(e)
        for e in ((nf.raw.get("software") or {}).get("error"), (nf.raw.get("outputs_inside") or {}).get("error"))
        if e
    ]
    why = next(
        (
            ln.strip()
            for text in said
            for ln in text.splitlines()
            if _NO_EXEC.search(ln) and (c.python in ln or "Fatal Python error" in ln)
        ),
        None,
    )
    if why is None:
        return False
    why = why.removeprefix("version probe failed: ").removeprefix("could not look inside the container: ")
    f.add(
        "fail",
        f"job.container.python {c.python} cannot be run inside the container as {container_user(c)} "
        f"(job.container.user): {why}",
        "the interpreter and every folder above it must be readable by that user inside the image (one mounted "
        "under the image's /root, mode 0700, is not: mount it elsewhere), so fix job.container.python or its "
        "mount, or set job.container.user (host, root, UID:GID) to a user that can run it",
    )
    return True


_STARTS = (
    ("error setting rlimit", "limits_fix"),
    ("container-init binary not found", "init_fix"),
    ('"docker-init": executable file not found', "init_fix"),
)
"""What a runtime says where the node itself refuses the container's start, and the table's fix."""


def start_finding(rt: Runtime, rdma: bool, nf: NodeFacts, f: Findings) -> bool:
    """Nothing ran inside the job's container (the probe's `container_start`: the runtime's own
    words): the line that says why, and its fix where the node refuses what the start asks (no
    CAP_SYS_RESOURCE for a `--ulimit`, no init binary for `--init`: `Runtime.limits_fix`,
    `init_fix`). True when the start failed (a row that said it already is not repeated)."""
    start = nf.raw.get("container_start")
    if not isinstance(start, dict):
        return False
    lines = [ln.strip() for ln in str(start.get("err") or "").splitlines() if ln.strip()]
    said = next((ln for ln in lines if ln.lower().startswith(("error", "docker:"))), lines[-1] if lines else "")
    for words, fix in _STARTS:
        line = next((ln for ln in lines if words in ln), None)
        if line is not None:
            hint = getattr(rt, fix)
            if fix == "limits_fix" and rdma:
                hint = "orch asks for --ulimit memlock=-1 because checks.rdma.devices is set; " + hint
            f.add("fail", f"{rt.name} cannot start the job's container on this node: {line}", hint)
            return True
    if any(status == "fail" for status, _, _ in f.items):  # the GPUs, the interpreter: said already
        return True
    f.add(
        "fail",
        f"{rt.name} could not start the job's container: {said or 'exit ' + str(start.get('rc'))}",
        "run it by hand as orch up --dry-run shows it",
    )
    return True


def outputs_finding(c: Container, nf: NodeFacts, f: Findings) -> None:
    """The job's output folders, as its container's user sees them inside the container (the
    probe looked from a container started as the launch's): each must be writable there."""
    inside = nf.raw.get("outputs_inside")
    if not isinstance(inside, dict):
        return
    if inside.get("error"):
        f.add(
            "fail",
            f"could not look at the output folders inside the container: {inside['error']}",
            "run the image by hand as orch up --dry-run shows it",
        )
        return
    for key, seen in (inside.get("paths") or {}).items():
        if not seen.get("writable"):
            f.add(
                "fail",
                f"--{key.replace('_', '-')}: {seen.get('checked')} is not writable inside the container "
                f"(as {container_user(c)}): the run could write no checkpoint",
                "mount it writable (no :ro in job.container.mounts), or let job.container.user write it",
            )


def rdma_finding(nf: NodeFacts, f: Findings) -> None:
    """With `checks.rdma.devices`: inside the job's container (the software facts' own, started as
    the launch's) memlock is unlimited and the verbs devices are there; otherwise NCCL does not use
    InfiniBand and falls back to sockets without an error."""
    sw = nf.raw.get("software") or {}
    if "memlock" not in sw:
        return
    memlock = sw.get("memlock")
    if isinstance(memlock, int) and memlock != -1:
        f.add(
            "fail",
            f"memlock is {memlock >> 10} KiB inside the container, not unlimited: NCCL cannot pin its "
            "RDMA buffers and falls back to sockets without an error",
            "leave --ulimit memlock out of job.container.options (orch sets memlock=-1), and raise the "
            "runtime's own limit (docker: default-ulimits in daemon.json; the node's hard limit)",
        )
    if not sw.get("infiniband"):
        f.add(
            "fail",
            "no /dev/infiniband inside the container although checks.rdma.devices is set: NCCL would use sockets",
            "orch passes --device /dev/infiniband: check that the node has it (ibv_devices)",
        )
