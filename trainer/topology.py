"""Where this process sits in the job, from torchrun's environment: standard library only, so the
entry point checks its arguments against the world before it imports torch."""

from __future__ import annotations

import os
from dataclasses import dataclass


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
