"""Topology from torchrun's environment and the few collectives the loop needs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from trainer.config import TrainConfig, precision_problems, topology_problems, with_world_size
from trainer.errors import refusal


@dataclass(frozen=True)
class Topology:
    """Where this process sits in the job, as torchrun told it through the environment."""

    rank: int = 0
    """Global rank (RANK); 0 for a plain single process."""
    local_rank: int = 0
    """Rank on this node (LOCAL_RANK): picks the CUDA device, never RANK (fails on node >= 1)."""
    world_size: int = 1
    """Number of processes in the job (WORLD_SIZE)."""
    launched: bool = False
    """True when started by torchrun (RANK is set), even with a single process."""
    local_world_size: int = 1
    """Processes on this node (LOCAL_WORLD_SIZE): the loader workers share its CPUs."""

    @classmethod
    def from_env(cls) -> Topology:
        """Read RANK, LOCAL_RANK and WORLD_SIZE; a plain ``python -m trainer`` is rank 0 of 1."""
        if "RANK" not in os.environ:
            return cls()
        return cls(
            rank=int(os.environ["RANK"]),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            launched=True,
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )

    @property
    def distributed(self) -> bool:
        """Whether there is a process group to talk to (more than one rank)."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, validates the summary and writes checkpoints."""
        return self.rank == 0


def omp_threads_given() -> str | None:
    """OMP_NUM_THREADS as this process was started with (by the user, or by torchrun), or None.

    Read from /proc/self/environ, which what the process changes later does not touch: `import
    ultralytics` sets OMP_NUM_THREADS=1 where it is unset, and that is nobody's choice. Where there
    is no /proc, the environment as it is now."""
    try:
        with open("/proc/self/environ", "rb") as fh:
            start = fh.read().split(b"\0")
    except OSError:
        return os.environ.get("OMP_NUM_THREADS") or None
    for entry in start:
        if entry.startswith(b"OMP_NUM_THREADS="):
            return entry.split(b"=", 1)[1].decode(errors="replace") or None
    return None


def cpu_threads(topo: Topology) -> int | None:
    """Intra-op threads for training on CPU, as ultralytics' trainer sets them (``min(8, CPUs - 1)``,
    leaving a core to the data pipeline), here shared by this node's ranks; None when
    OMP_NUM_THREADS was given (by the user, or by torchrun, which sets 1 for several processes per
    node: ``omp_threads_given``): that count stands."""
    if omp_threads_given():
        return None
    return max(1, min(8, (os.cpu_count() or 1) // max(topo.local_world_size, 1) - 1))


def pick_device(requested: str, topo: Topology, backend: str = "auto") -> torch.device:
    """This rank's device, decided and checked without touching it (what ``--check`` asks):
    ``cuda:LOCAL_RANK`` when CUDA is asked for (or auto and present), or the LOCAL_RANK-th GPU of a
    ``cuda:0,1,2,3`` list (indices as CUDA_VISIBLE_DEVICES shows them); else the CPU. With the gloo
    ``backend`` a LOCAL_RANK beyond the GPUs shares one: LOCAL_RANK modulo their count
    (``--dist-backend gloo``, for testing DDP on one GPU; NCCL refuses two ranks on one device).

    Raises:
        ValueError: CUDA requested but not available, or a GPU index this node does not have.
    """
    want_cuda = requested.startswith("cuda") or (requested == "auto" and torch.cuda.is_available())
    if not want_cuda:
        return torch.device("cpu")
    count = torch.cuda.device_count()
    visible = f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}"
    if count == 0:
        raise ValueError(
            f"--device {requested.removeprefix('cuda:')} but torch sees no GPU (check {visible} and the driver)"
        )
    if requested.startswith("cuda:"):
        ids = [int(x) for x in requested[5:].split(",")]
        index = ids[topo.local_rank] if topo.local_rank < len(ids) else ids[-1]
        if index >= count:
            raise ValueError(
                f"--device {requested[5:]}: GPU {index} does not exist, this node shows {count} ({visible})"
            )
    else:
        index = topo.local_rank % count if backend == "gloo" else topo.local_rank
        if index >= count:
            raise ValueError(
                f"LOCAL_RANK {index} has no GPU: this node shows {count} ({visible}); "
                + ("job.nproc_per_node in the inventory" if os.environ.get("ORCH_RUN_ID") else "--nproc-per-node")
                + " must not exceed the visible GPUs"
            )
    return torch.device("cuda", index)


def select_device(requested: str, topo: Topology, backend: str = "auto") -> torch.device:
    """Pick this rank's device (``pick_device``) and make it current: the CUDA device, or on the
    CPU ultralytics' thread count (``cpu_threads``).

    Raises:
        ValueError: CUDA requested but not available, or a GPU index this node does not have.
    """
    device = pick_device(requested, topo, backend)
    if device.type == "cuda":
        torch.cuda.set_device(device.index)
        return device
    threads = cpu_threads(topo)
    if threads is not None:
        torch.set_num_threads(threads)
    return device


def start_device(
    cfg: TrainConfig, topo: Topology, select: bool = True, found: list[str] | None = None
) -> tuple[TrainConfig, torch.device]:
    """What a start (and ``--check``) decides before reading any file: the global batch of
    ``--batch-per-device``, the topology's rules, this rank's device (made current with
    ``select``), and what ``--amp`` and ``--sync-bn`` need of it. Every problem in one refusal:
    a device that is not there still gets its precision judged, on the device the rank would
    have (the CPU when torch sees no GPU). ``found``: the arguments' own problems
    (``parse_config(problems=...)``), named first.

    Raises:
        TrainerError: all the problems at once; ``.stage`` is where the first was found:
            ``arguments``, ``topology`` or ``device``.
    """
    cfg, device, problems, stage = device_problems(cfg, topo, select, found)
    if problems:
        err = refusal(problems)
        err.stage = stage  # type: ignore[attr-defined]
        raise err
    return cfg, device


def device_problems(
    cfg: TrainConfig, topo: Topology, select: bool = True, found: list[str] | None = None
) -> tuple[TrainConfig, torch.device, list[str], str]:
    """``start_device``'s decisions without refusing: the config, the device (the one this rank
    would have, the CPU when torch sees no GPU, where the asked-for one is not there), every
    problem found (``found`` first) and the stage of the first (``arguments``, ``topology``,
    ``device``), for ``loop.admit`` to refuse together with the inputs' problems."""
    cfg = with_world_size(cfg, topo.world_size)
    problems = list(found or [])
    stage = "arguments" if problems else "topology"
    problems += topology_problems(cfg, topo.world_size, topo.launched, topo.local_world_size)
    stage = stage if problems else "device"
    try:
        device = (select_device if select else pick_device)(cfg.device, topo, cfg.dist_backend)
    except ValueError as e:
        problems.append(str(e))
        device = torch.device("cuda" if cfg.device != "cpu" and torch.cuda.is_available() else "cpu")
    problems += precision_problems(cfg, device.type, topo.distributed)
    return cfg, device, problems, stage


_STARTUP_TIMEOUT: timedelta | None = None
"""The start-up barriers' timeout (``startup_barrier``), set by ``init``."""
_STARTUP_BARRIERS = 0
"""Start-up barriers this process has passed: each one's keys in the store are its own."""


def backend_of(requested: str, device: torch.device) -> str:
    """The process group's backend: ``--dist-backend``, auto = nccl on CUDA, gloo on CPU."""
    return requested if requested != "auto" else "nccl" if device.type == "cuda" else "gloo"


def init(
    topo: Topology,
    device: torch.device,
    timeout_min: float,
    startup_timeout_min: float | None = None,
    backend: str = "auto",
) -> None:
    """Join the process group (``backend_of``: nccl on CUDA, gloo on CPU, or what
    ``--dist-backend`` says); a single process joins none.

    The barriers of the start-up only (datasets built and cached, at COCO scale minutes per rank)
    wait ``startup_timeout_min`` on the rendezvous store torchrun already serves, not on a Gloo
    group: a Gloo group binds the address the hostname resolves to (loopback on stock Ubuntu's
    127.0.1.1, or when it resolves to nothing) and would need GLOO_SOCKET_IFNAME on an NCCL run.
    The job's collective timeout, which catches a lost rank in training, stays short."""
    global _STARTUP_TIMEOUT
    if topo.distributed:
        chosen = backend_of(backend, device)
        kwargs: dict[str, Any] = {"device_id": device} if chosen == "nccl" else {}
        dist.init_process_group(chosen, timeout=timedelta(minutes=timeout_min), **kwargs)
        startup = max(startup_timeout_min if startup_timeout_min is not None else timeout_min, timeout_min)
        _STARTUP_TIMEOUT = timedelta(minutes=startup)


VERDICT_WAIT_S = 60.0
"""How long a rank that refuses its inputs waits for every other rank's verdict before it exits."""


def verdict(topo: Topology, refused: bool, wait_s: float = VERDICT_WAIT_S) -> None:
    """Mark this rank's verdict on its inputs on the store torchrun serves; a rank that refuses
    first waits (at most ``wait_s``) until every rank has one. torchrun stops every worker as soon
    as one exits, so without this a rank still importing its libraries would be killed before it
    could say what is wrong on its own node (its file missing, its device). Outside torchrun's
    agent store (a single process, an older launcher) it does nothing."""
    if not topo.distributed or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    try:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=max(wait_s, 1.0)),
        )
        key = f"trainer/verdicts/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        count = store.add(key, 1)
        deadline = time.monotonic() + wait_s
        while refused and count < topo.world_size and time.monotonic() < deadline:
            time.sleep(0.05)
            count = store.add(key, 0)
    except (dist.DistError, OSError, KeyError, ValueError):
        return  # no store to meet on: the refusal is said anyway, only perhaps alone


def close() -> None:
    """Leave the process group if we joined one (after a run that ended normally)."""
    global _STARTUP_TIMEOUT
    _STARTUP_TIMEOUT = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def abort() -> bool:
    """Abort the process group after an exception, instead of leaving it gracefully.

    ``destroy_process_group`` finalizes NCCL communicators gracefully, which waits for the peers;
    a rank that raised would then sit in it while the others sit in their collective until the
    timeout. Aborting drops the communicators at once, so the rank exits and torchrun (and orch)
    see the failure now. Returns whether there was a group to abort."""
    global _STARTUP_TIMEOUT
    _STARTUP_TIMEOUT = None
    if not (dist.is_available() and dist.is_initialized()):
        return False
    from torch.distributed.distributed_c10d import _abort_process_group

    _abort_process_group()  # every group, the default one included (torch >= 2.6)
    return True


EXIT_LINGER_S = 1.0
"""How long rank 0 outlives the other ranks at the end of a job (see ``leave_last``)."""


def leave_last(topo: Topology) -> None:
    """Rank 0 exits a moment after the others, so the master node's torchrun, which hosts the
    rendezvous store, is the last to reach torchrun's exit barrier: when another node's agent is
    the last, the master may close the store while that agent still waits on it, and the agent
    prints a DistNetworkError traceback at the end of a successful run (pytorch#69520).
    """
    if topo.distributed and topo.is_main:
        time.sleep(EXIT_LINGER_S)


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    if dist.is_initialized():
        dist.barrier()


WAITING: list[Callable[[list[int]], None]] = []
"""Who hears, while a start-up barrier waits, which ranks have not reached it yet (the start-up
heartbeat, ``data.Heartbeat``, while it runs)."""
BARRIER_POLL_S = 5.0
"""How often a start-up barrier looks at who has arrived while it waits."""


def startup_barrier() -> None:
    """Wait for every rank at start-up, on the rendezvous store with the long start-up timeout
    (``store_barrier``), saying to ``WAITING`` whom it waits for; no-op without a process group."""
    global _STARTUP_BARRIERS
    if not dist.is_initialized():
        return
    from torch.distributed.distributed_c10d import _get_default_store

    _STARTUP_BARRIERS += 1
    store_barrier(
        _get_default_store(),
        f"orch/startup/{_STARTUP_BARRIERS}",
        dist.get_world_size(),
        _STARTUP_TIMEOUT or timedelta(minutes=30),
        rank=dist.get_rank(),
        waiting=lambda missing: [hear(missing) for hear in WAITING],
    )


def store_barrier(
    store: Any,
    key: str,
    world_size: int,
    timeout: timedelta,
    rank: int | None = None,
    waiting: Callable[[list[int]], Any] | None = None,
    poll_s: float = BARRIER_POLL_S,
) -> None:
    """Wait until ``world_size`` processes reached the barrier ``key`` of ``store`` (a c10d Store:
    torchrun's TCPStore): each adds one; the last to arrive opens it. With ``rank`` each also marks
    its own arrival, and every ``poll_s`` while it waits ``waiting`` hears the ranks that have not
    arrived: a rank that died building its dataset is named by the ones waiting for it.

    Raises:
        torch.distributed.DistStoreError: not every process arrived within ``timeout``.
    """
    if rank is not None:
        store.set(f"{key}/rank{rank}", b"1")
    if store.add(key, 1) == world_size:
        store.set(f"{key}/open", b"1")
    if rank is None or waiting is None:
        store.wait([f"{key}/open"], timeout)
        return
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        left = deadline - time.monotonic()
        try:
            store.wait([f"{key}/open"], timedelta(seconds=max(min(poll_s, left), 0.001)))
            waiting([])  # nobody is waited for any more
            return
        except dist.DistStoreError:
            if time.monotonic() >= deadline:
                raise
        waiting([r for r in range(world_size) if not store.check([f"{key}/rank{r}"])])


def gather_rows(row: torch.Tensor) -> list[list[float]]:
    """All-gather one row of numbers from every rank, in rank order, read to the host once."""
    if not dist.is_initialized():
        return [row.tolist()]
    rows = [torch.empty_like(row) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, row)
    return torch.stack(rows).tolist()


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if not dist.is_initialized():
        return [obj]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, obj)
    return everyone


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on at least one rank (the same answer on every rank)."""
    if not dist.is_initialized():
        return flag
    box = [flag]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, box[0])
    return any(everyone)


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


GRAD_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
"""``--ddp-grad-dtype``'s words and the dtype each sends."""


class GradComm:
    """DDP's gradient all-reduce as a comm hook (``DDP.register_comm_hook``) that counts what this
    rank sends: each bucket cast to ``dtype`` (fp16, bf16: torch's compression hooks, half the
    bytes of fp32), divided by the world size, summed over the ranks, cast back into the bucket.
    fp32 is DDP's own all-reduce (the bucket as it is), here counted too."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.bytes = 0
        """Bytes this rank handed to the all-reduces."""
        self.buckets = 0
        """All-reduces (one per bucket per optimizer step)."""
        self.steps = 0
        """Optimizer steps whose gradients were all-reduced (a step's last bucket counts it)."""

    def send(self, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        """All-reduce one bucket (DDP calls this once per bucket, on the step's last micro-step)."""
        buffer = bucket.buffer()
        sent = buffer if buffer.dtype == self.dtype else buffer.to(self.dtype)
        sent.div_(dist.get_world_size())
        self.bytes += sent.numel() * sent.element_size()
        self.buckets += 1
        self.steps += int(bucket.is_last())
        future = dist.all_reduce(sent, async_op=True).get_future()
        if sent is buffer:
            return future.then(lambda f: f.value()[0])

        def back(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            return buffer.copy_(f.value()[0])  # in place: no second bucket-sized buffer

        return future.then(back)

    def register(self, ddp: Any) -> None:
        """Make this hook ``ddp``'s gradient all-reduce (DDP checks a hook's annotations: a lambda has none)."""
        ddp.register_comm_hook(self, lambda state, bucket: state.send(bucket))

    def record(self) -> dict[str, Any]:
        """What the debug record says of it."""
        return {
            "dtype": str(self.dtype).removeprefix("torch."),
            "bytes": self.bytes,
            "buckets": self.buckets,
            "steps": self.steps,
            "bytes_per_step": self.bytes / self.steps if self.steps else None,
        }


def broadcast_buffers(module: torch.nn.Module) -> None:
    """Copy rank 0's buffers (BatchNorm running stats) to every rank.

    DDP runs with ``broadcast_buffers=False`` (as ultralytics does), so each rank's running stats
    drift apart; the EMA model that is validated and saved must be the same everywhere.
    """
    if not dist.is_initialized():
        return
    for buf in module.buffers():
        if buf.is_floating_point() or buf.dtype in (torch.int64, torch.int32):
            dist.broadcast(buf, src=0)
