"""What a node's GPUs, driver and torch must agree on before a CUDA job can start. Pure.

- **Kernels for the GPU.** torch carries machine code for the architectures it was built for
  (`torch.cuda.get_arch_list()`: `sm_XY`) and PTX (`compute_XY`) the driver can compile at load
  time. NVIDIA's compatibility rules (CUDA C++ Programming Guide, "Binary Compatibility" and "PTX
  Compatibility"): a cubin for `sm_XY` runs on a GPU of compute capability X.Z with Z >= Y (same
  major only); `sm_XYa` (architecture-specific features) on X.Y alone; `sm_XYf` (family) on the
  same major with Z >= Y; PTX for `compute_XY` on any GPU of capability X.Y or higher (`a`/`f`
  PTX as their cubins). A GPU that nothing in the list runs on gets "no kernel image is
  available for execution on the device" at the job's first kernel.
- **The driver for torch's CUDA.** A torch wheel brings its CUDA runtime; the node's driver must
  be new enough for that CUDA major release. NVIDIA, "CUDA Compatibility: Minor Version
  Compatibility", Table 1 (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html):
  CUDA 13.x needs driver >= 580, CUDA 12.x >= 525, CUDA 11.x >= 450 (450.80.02, the note under
  the table, for the whole 11.x family). Below it, `torch.cuda.is_available()` is False ("CUDA
  driver version is insufficient"). Minor version compatibility runs cubins only: PTX compiled
  by a newer toolkit than the driver's own CUDA version cannot be JIT-compiled
  (cudaErrorUnsupportedPtxVersion), so a GPU only PTX covers needs the driver's CUDA version
  (nvidia-smi's `CUDA Version`) at least torch's.
- **The GPUs a job sees.** CUDA_VISIBLE_DEVICES (CUDA C++ Programming Guide, "CUDA Environment
  Variables"): unset, every GPU; empty, none; else a comma list of indices (nvidia-smi's) or UUIDs
  (`GPU-...`, any unique prefix of one; `MIG-...` for a MIG device). At the first entry that names
  no GPU CUDA stops: only the entries before it are visible.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .parsers import Gpu

MIN_DRIVER: dict[int, tuple[int, ...]] = {13: (580,), 12: (525,), 11: (450, 80, 2)}
"""The oldest driver each CUDA major release runs on (NVIDIA's minor-version compatibility table)."""
PTX_NOTE = "cudaErrorUnsupportedPtxVersion"

_ARCH = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")


@dataclass(frozen=True)
class Arch:
    """One entry of torch's arch list."""

    text: str
    ptx: bool
    major: int
    minor: int
    variant: str
    """`a` (architecture-specific), `f` (family) or empty."""

    def runs_on(self, cc: tuple[int, int]) -> bool:
        """Whether this cubin or PTX runs on a GPU of compute capability `cc`."""
        if self.variant == "a":
            return cc == (self.major, self.minor)
        if self.ptx and not self.variant:
            return cc >= (self.major, self.minor)
        return cc[0] == self.major and cc[1] >= self.minor


def parse_arch(text: str) -> Arch | None:
    """`sm_70` → Arch(sm, 7, 0); `sm_100a`, `compute_120`; None for anything else."""
    m = _ARCH.match(text.strip())
    if not m:
        return None
    return Arch(text.strip(), m.group(1) == "compute", int(m.group(2)), int(m.group(3)), m.group(4))


def sm(cc: tuple[int, int]) -> str:
    """(7, 0) → `sm_70`."""
    return f"sm_{cc[0]}{cc[1]}"


@dataclass(frozen=True)
class KernelFit:
    """How torch's arch list covers one compute capability."""

    cubin: bool
    """A cubin runs on it."""
    ptx_only: bool
    """No cubin, but PTX the driver would JIT-compile."""

    @property
    def ok(self) -> bool:
        return self.cubin or self.ptx_only


def kernel_fit(arch_list: Sequence[str], cc: tuple[int, int]) -> KernelFit:
    archs = [a for a in (parse_arch(x) for x in arch_list) if a is not None]
    cubin = any(a.runs_on(cc) for a in archs if not a.ptx)
    return KernelFit(cubin, not cubin and any(a.runs_on(cc) for a in archs if a.ptx))


def builds_for(releases: dict[str, list[int]], cc: tuple[int, int]) -> list[str]:
    """The CUDA versions whose builds of this torch release carry a cubin for `cc`, from torch's
    own table (`torch.cuda.PYTORCH_RELEASES_CODE_CC`, {CUDA version: [75, 80, ...]}, as the
    node's torch reported it), oldest first."""
    fits = [
        cuda
        for cuda, codes in releases.items()
        if any(Arch(f"sm_{c}", False, c // 10, c % 10, "").runs_on(cc) for c in codes)
    ]
    return sorted(fits, key=version)


def version(text: str | None) -> tuple[int, ...]:
    """`535.129.03` → (535, 129, 3); `13.0` → (13, 0); () when there is no number."""
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:4])


def min_driver(cuda: str) -> tuple[int, ...] | None:
    """The oldest driver CUDA `cuda` (torch.version.cuda) runs on, or None for a major not in the table."""
    v = version(cuda)
    return MIN_DRIVER.get(v[0]) if v else None


def dotted(v: tuple[int, ...]) -> str:
    return ".".join(f"{x:02d}" if i == 2 else str(x) for i, x in enumerate(v))


@dataclass(frozen=True)
class Visible:
    """The GPUs CUDA_VISIBLE_DEVICES leaves a job, and what is wrong with its value."""

    value: str | None
    """The variable as the job sees it; None when unset."""
    gpus: tuple[Gpu, ...]
    """The GPUs CUDA enumerates, in its order."""
    unverified: int = 0
    """Entries counted but not checked against nvidia-smi (MIG devices; UUIDs nvidia-smi did not list)."""
    problems: tuple[str, ...] = ()
    """Entries that name nothing (CUDA stops there), ambiguously or twice."""

    @property
    def count(self) -> int:
        return len(self.gpus) + self.unverified


def visible_devices(value: str | None, gpus: Sequence[Gpu]) -> Visible:
    """Apply CUDA_VISIBLE_DEVICES to the node's GPUs as CUDA does (see the module docstring)."""
    if value is None:
        return Visible(None, tuple(gpus))
    have = ", ".join(str(g.index) for g in gpus) or "none"
    seen: list[Gpu] = []
    unverified = 0
    problems: list[str] = []
    entries = [e.strip() for e in value.split(",")] if value.strip() else []
    for i, entry in enumerate(entries):
        rest = entries[i + 1 :]
        after = f"; CUDA ignores it and what follows it ({','.join(rest)})" if rest else "; CUDA ignores it"
        found: Gpu | None = None
        if re.fullmatch(r"-?\d+", entry):
            found = next((g for g in gpus if g.index == int(entry)), None)
            if found is None:
                problems.append(f"{entry} is not a GPU of this node (indices {have}){after}")
                break
        elif entry.upper().startswith("GPU-"):
            listed = [g for g in gpus if g.uuid]
            if not listed:
                unverified += 1
                continue
            matches = [g for g in listed if g.uuid and g.uuid.lower().startswith(entry.lower())]
            if len(matches) != 1:
                what = "no GPU of this node" if not matches else f"{len(matches)} GPUs of this node"
                problems.append(f"{entry} matches {what} (nvidia-smi -L lists their UUIDs){after}")
                break
            found = matches[0]
        elif entry.upper().startswith("MIG-"):
            unverified += 1
            continue
        else:
            problems.append(f"{entry!r} is neither a GPU index nor a UUID{after}")
            break
        if found in seen:
            problems.append(f"{entry} names GPU {found.index} a second time")
            continue
        seen.append(found)
    return Visible(value, tuple(seen), unverified, tuple(problems))
