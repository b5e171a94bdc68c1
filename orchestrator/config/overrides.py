"""What the command line changes of an inventory for one run, without editing the YAML (DeepSpeed's
`--include/--exclude/--num_nodes`, torchrun's trailing script args, `--env K=V`). Pure.

`apply(inv, overrides)` returns the inventory the run is planned from: only the chosen nodes, in
the inventory's order with the master first (so node ranks are exactly those of an inventory
that listed only them), the job's arguments with the command line's after them (a trainer
setting given both ways: the command line's replaces the inventory's), and the extra environment
on top of the inventory's and each node's. The overrides are recorded in run.json
(`overrides`, `to_json`) and applied again wherever the run's inventory is read back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from ..errors import UsageError
from .inventory import ENV_NAME, SHELL_UNSAFE, Inventory
from .nodes import Node
from .trainer import override_args, settings_of


@dataclass(frozen=True)
class Overrides:
    """`orch up/check`'s node selection, `--env` and the words after `--`."""

    args: tuple[str, ...] = ()
    """Words appended to the job's arguments (after `--`)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """`--env K=V`: on top of the inventory's `env` and every node's."""
    include: str | None = None
    """`--include SET`: only these nodes (names or ranges)."""
    exclude: str | None = None
    """`--exclude SET`: not these."""
    first: int | None = None
    """`--nodes N`: the first N (after include/exclude) in inventory order."""
    master: str | None = None
    """`--master NODE`: the node that becomes node rank 0."""

    @property
    def empty(self) -> bool:
        return not (self.args or self.env or self.include or self.exclude or self.first is not None or self.master)

    @property
    def selects(self) -> bool:
        return bool(self.include or self.exclude or self.first is not None or self.master)

    def to_json(self, env_values: bool = True) -> dict[str, Any]:
        """run.json `overrides` (env values kept there, as the private snapshot and plan.json keep
        theirs); for a person or a script (`--dry-run --json`) the values are `plan.HIDDEN`
        unless `env_values` (`--show-env`)."""
        from .plan import HIDDEN

        env = dict(self.env) if env_values else dict.fromkeys(self.env, HIDDEN)
        return {
            "args": list(self.args),
            "env": env,
            "include": self.include,
            "exclude": self.exclude,
            "nodes": self.first,
            "master": self.master,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Overrides:
        return cls(
            args=tuple(str(a) for a in data.get("args") or ()),
            env=dict(data.get("env") or {}),
            include=data.get("include"),
            exclude=data.get("exclude"),
            first=data.get("nodes"),
            master=data.get("master"),
        )


def parse_env(pairs: tuple[str, ...] | list[str], option: str = "--env") -> dict[str, str]:
    """`("NCCL_DEBUG=INFO", "A=")` -> `{"NCCL_DEBUG": "INFO", "A": ""}`, validated like an
    inventory's `env` (a name `[A-Za-z_][A-Za-z0-9_]*`, a value that needs no shell), else
    UsageError (exit 2) naming the pair and the fix."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq:
            raise UsageError(f"{option} {pair!r}: give NAME=VALUE", f"e.g. {option} NCCL_DEBUG=INFO")
        if not ENV_NAME.match(name):
            raise UsageError(
                f"{option} {pair!r}: {name!r} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
                f"e.g. {option} NCCL_DEBUG=INFO",
            )
        bad = [c for c in SHELL_UNSAFE if c in value]
        if bad:
            raise UsageError(
                f"{option} {name}: the value contains {', '.join(map(repr, bad))}, which would need a shell to be safe",
                "give a plain value (no ; & | < > ` $( ${ or line breaks)",
            )
        if name in out and out[name] != value:
            raise UsageError(
                f"{option} {name} is given twice with different values ({out[name]!r} and {value!r})", "give it once"
            )
        out[name] = value
    return out


def select_nodes(inv: Inventory, ov: Overrides) -> tuple[list[Node], Node]:
    """The chosen nodes in inventory (file) order, and the master among them. UsageError (exit 2)
    when the selection is empty, names no node, or leaves the master out without `--master`."""
    from .nodeset import fold, select

    in_file_order = sorted(inv.nodes, key=lambda n: n.index)
    chosen = select(ov.include, in_file_order, "--include")
    if ov.exclude:
        dropped = {n.name for n in select(ov.exclude, in_file_order, "--exclude")}
        chosen = [n for n in chosen if n.name not in dropped]
    if ov.first is not None:
        if ov.first < 1:
            raise UsageError(f"--nodes {ov.first}: give at least 1", "e.g. --nodes 2: the first two nodes")
        if ov.first > len(chosen):
            raise UsageError(
                f"--nodes {ov.first}: only {len(chosen)} nodes to choose from ({fold(n.name for n in chosen)})",
                f"give --nodes {len(chosen)} or fewer",
            )
        chosen = chosen[: ov.first]
    if not chosen:
        raise UsageError("--include/--exclude leave no node", f"the nodes are {fold(n.name for n in in_file_order)}")
    if ov.master is not None:
        master = next((n for n in chosen if ov.master in (n.name, n.host)), None)
        if master is None:
            raise UsageError(
                f"--master {ov.master}: not one of the chosen nodes ({fold(n.name for n in chosen)})",
                f"give one of them, e.g. --master {chosen[0].name}",
            )
    elif inv.master in chosen:
        master = inv.master
    else:
        raise UsageError(
            f"the master {inv.master.name} is not among the chosen nodes ({fold(n.name for n in chosen)})",
            f"include it, or say which node becomes node rank 0: --master {chosen[0].name}",
        )
    return chosen, master


def apply(inv: Inventory, ov: Overrides) -> Inventory:
    """The inventory this run is planned from (see the module's docstring)."""
    if ov.empty:
        return inv
    if not inv.nodes:  # a Slurm inventory: the nodes are its allocation's, made from inv.env later
        if ov.selects:
            raise UsageError(
                "--include/--exclude/--nodes/--master: the nodes are the Slurm allocation's",
                "set slurm.nodes (and master.node) in the inventory",
            )
        job = replace(inv.job, args=_job_args(inv, ov.args)) if ov.args else inv.job
        if ov.args:
            job = replace(job, raw_args=MappingProxyType(_raw_args(inv.job.raw_args, ov.args)))
        return replace(inv, env=MappingProxyType({**inv.env, **ov.env}), job=job)
    nodes, master = select_nodes(inv, ov) if ov.selects else (list(inv.nodes), inv.master)
    if ov.env:
        nodes = [replace(n, env=MappingProxyType({**n.env, **ov.env})) for n in nodes]
        master = next(n for n in nodes if n.name == master.name)
    ordered = (master, *sorted((n for n in nodes if n is not master), key=lambda n: n.index))
    job = inv.job
    if ov.args:
        job = replace(job, args=_job_args(inv, ov.args), raw_args=MappingProxyType(_raw_args(job.raw_args, ov.args)))
    return replace(inv, nodes=ordered, env=MappingProxyType({**inv.env, **ov.env}), job=job)


def _job_args(inv: Inventory, extra: tuple[str, ...]) -> tuple[str, ...]:
    """This repository's trainer: the command line's settings replace the inventory's (it refuses
    a setting given twice); any other job: appended (argparse keeps the last)."""
    if inv.job.script is None and inv.job.module == "trainer":
        return override_args(inv.job.args, extra)
    return (*inv.job.args, *extra)


def _raw_args(raw: Mapping[str, Any], extra: tuple[str, ...]) -> dict[str, Any]:
    """The YAML mapping the preflight judges (batch, paths), with the command line's values in
    place: `--batch 64` after `batch: 384` is judged as 64, `--batch-per-device 8` leaves no
    `batch`, `--cfg yolo12s.yaml` is the `model`."""
    from .trainer import replaced, setting_name, setting_value, value_setting

    out = dict(raw)
    for name, words in settings_of(list(extra)):
        if name is None:
            continue
        gone = replaced(name)
        for key in [k for k in out if _raw_name(k, out[k], setting_name, value_setting) in gone]:
            del out[key]
        value: Any = setting_value(words)
        if setting_name(words[0]) == "cfg" and isinstance(value, str) and "=" in value:
            value = value.split("=", 1)[1]  # --cfg KEY=VALUE: KEY's value
        out[name] = _scalar(value)
    return out


def _raw_name(key: str, value: Any, setting_name: Any, value_setting: Any) -> str | None:
    """The setting an inventory's `key: value` sets (`cfg: yolo12s.yaml` is the model)."""
    name = setting_name(f"--{key}")
    return value_setting(name, value) if name is not None else None


def _scalar(value: Any) -> Any:
    """A command-line word as the YAML value it would be (`64` -> 64, `0.5` -> 0.5, `true` -> True)."""
    if not isinstance(value, str):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(value.lower(), value)
