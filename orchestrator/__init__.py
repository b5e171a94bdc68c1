"""orch: preflight, launch, supervise and follow torchrun jobs on GPU servers reachable over SSH."""

__version__ = "0.1.0"
