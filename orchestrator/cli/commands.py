"""`orch`'s commands: parse the options (click), call the library, hand what it returns to
`render`, and exit with the code docs/CONTRACT.md gives that outcome.

Exit codes (`contract.ExitCode`): 0 ok · 1 failure (a check failed / the job failed) · 2 bad usage
or inventory · 3 preflight failed, nothing launched · 130 interrupted (after teardown).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import traceback
from typing import Any

import click

from .. import __version__
from ..config.inventory import Inventory
from ..config.inventory import load as load_inventory
from ..config.runtimes import RUNTIMES
from ..config.runtimes import TABLE as RUNTIME_TABLE
from ..config.schema import default_of, yaml_text
from ..contract import CHECK_NAMES, ExitCode
from ..errors import OrchError, UsageError
from . import complete, render

METHODS = ("auto", "chain", "direct")
"""`--method` of `orch sync` and `orch image push` (remote/chain.py `METHODS`, without importing it:
tests/unit/test_chain.py holds the two to one list)."""
IMAGE_STALL_S = 30.0
"""`orch image push --stall-timeout`'s default (remote/image.py `STALL_S`, without importing it:
tests/unit/test_image.py holds the two, and docs/CONTRACT.md, to one value)."""
DEFAULT_RUNS = 20
"""How many runs `orch runs` lists without --all (run.history.DEFAULT_LIMIT, without importing it)."""
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
UP_EXIT = {
    "succeeded": ExitCode.OK,
    "detached": ExitCode.OK,
    "failed": ExitCode.FAILED,
    "start_failed": ExitCode.FAILED,
    "preflight_failed": ExitCode.PREFLIGHT_FAILED,
    "sync_failed": ExitCode.PREFLIGHT_FAILED,
    "interrupted": ExitCode.INTERRUPTED,
    "stopped": ExitCode.INTERRUPTED,
    "retry_preflight_failed": ExitCode.FAILED,
}
"""The exit code of each way `orch up` ends (docs/CONTRACT.md)."""
FOLLOW_EXIT = {"succeeded": ExitCode.OK, "failed": ExitCode.FAILED, "stopped": ExitCode.INTERRUPTED}
"""`orch logs --follow` that saw the run end: orch up's code for that end; an end it could not
tell (a node given up on) is 1."""


def default(key: str) -> str:
    """An inventory key's default as the help says it: the schema's, spelled as in YAML."""
    return yaml_text(default_of(key))


class Number(click.FloatRange):
    """A float option's type: `nan`, `inf` and `1e999` are refused (exit 2) like a value out of
    range; click's FloatRange takes them (`--stall-timeout nan` would turn the watchdog off)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


class State:
    """Options shared by every command."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose


pass_state = click.make_pass_decorator(State)


def resolve_inventory(path: str | None, nodes: bool = False) -> Inventory:
    """INVENTORY, else $ORCH_INVENTORY, else the latest run's snapshot, else exit 2. `nodes`: the
    command needs the nodes now (exec, sync, image push): a Slurm inventory's are the allocation
    this process runs in, or the latest run's, else exit 2."""
    path = path or os.environ.get("ORCH_INVENTORY")
    if path:
        inv = load_inventory(path)
    else:
        from ..store import RunStore

        try:
            inv = RunStore().get().inventory(as_run=False)
        except UsageError:
            raise UsageError(
                "no INVENTORY given", "pass one (orch check inventory/v100.yaml) or set ORCH_INVENTORY"
            ) from None
    if nodes and not inv.nodes:
        from ..transport import transport_of

        inv = transport_of(inv).peek(inv)
        if not inv.nodes:
            raise UsageError(
                f"{inv.path}: the nodes come from a Slurm allocation, and this process is in none",
                "run it inside the allocation (salloc, srun --pty), or leave INVENTORY out: the latest run's nodes",
            )
    return inv


def split_names(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def node_selection(func: Any) -> Any:
    """`--include/--exclude/--nodes/--master` (DeepSpeed's launcher's habits) on up and check."""
    for option in reversed(
        [
            click.option(
                "--include",
                metavar="SET",
                shell_complete=complete.node_names,
                help="Only these nodes: names or ranges, e.g. n1,n[3-4].",
            ),
            click.option(
                "--exclude", metavar="SET", shell_complete=complete.node_names, help="Not these nodes, e.g. n2."
            ),
            click.option(
                "--nodes",
                "first",
                metavar="N|SET",
                shell_complete=complete.node_names,
                help="N: the first N nodes in inventory order (after --include/--exclude); a set of names "
                "works like --include.",
            ),
            click.option(
                "--master",
                metavar="NODE",
                shell_complete=complete.node_names,
                help="The node that becomes node rank 0 (needed when the inventory's master is left out).",
            ),
        ]
    ):
        func = option(func)
    return func


def overrides_from(
    include: str | None,
    exclude: str | None,
    first: str | None,
    master: str | None,
    env: tuple[str, ...] = (),
    args: list[str] | None = None,
) -> Any:
    """The command line's `config.overrides.Overrides` (validated: exit 2 on a bad --env)."""
    from ..config.overrides import Overrides, parse_env

    count = None
    if first is not None and first.strip().isdigit():
        count = int(first)
    elif first is not None:
        include = f"{include},{first}" if include else first
        if include != first:
            raise UsageError("--nodes SET and --include together", "give the nodes once, with --include")
    return Overrides(
        args=tuple(args or ()), env=parse_env(env), include=include, exclude=exclude, first=count, master=master
    )


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="orch")
@click.option("-v", "--verbose", is_flag=True, help="Show every remote command and full tracebacks.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """orch: turn GPU servers reachable over SSH into one training cluster.

    \b
    Typical session:
      orch check inventory/v100.yaml     # preflight every node
      orch up inventory/v100.yaml        # launch torchrun everywhere, follow, fail fast
      orch logs --follow                 # from any shell, for the latest run
      orch status                        # per-node state
      orch down                          # stop every process of the run

    State lives in $ORCH_HOME (default ~/.orch, the same from any directory); $ORCH_INVENTORY
    names the inventory when none is given. Shell completion of commands, flags, run ids,
    node names, check names and inventory files (bash; zsh_source, fish_source alike):
    eval "$(_ORCH_COMPLETE=bash_source orch)"
    """
    ctx.obj = State(verbose)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr
    )
    if not verbose:
        logging.getLogger("paramiko").setLevel(logging.CRITICAL)


class _CommandAfterDashes(complete.Remembering):
    """A command whose words after the first `--` are not its own: they are the command to run
    on the nodes (`ctx.meta["orch.command"]`, None without `--`), options and all."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["orch.command"] = args[cut + 1 :]
            args = args[:cut]
        else:
            ctx.meta["orch.command"] = None
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "-- CMD ..."]


CHECK_HELP = """Preflight every node in parallel; one table, or JSON with --json.

\b
Checks: {checks}.
Exit code: 0 no failure (warnings allowed), 1 a check failed, 2 bad inventory.

\b
The fabric check is opt-in (it launches a short torchrun job on every node: an all_reduce size
sweep and node-to-node rates, nccl-tests' busbw): --only fabric, or checks.fabric in the inventory.

\b
Examples:
  orch check inventory/v100.yaml
  orch check inventory/v100.yaml --only ssh,clock --json | jq .
  orch check inventory/v100.yaml --only fabric      # busbw per size, send/recv per node
  orch check inventory/v100.yaml --exclude v100-2 --master v100-3
""".format(checks=", ".join(CHECK_NAMES))


@cli.command(help=CHECK_HELP, cls=complete.Remembering, context_settings=CONTEXT)
@click.argument("inventory", required=False, shell_complete=complete.inventory_files)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout.")
@click.option("--only", shell_complete=complete.check_names, help="Run only these checks (comma separated).")
@click.option("--skip", shell_complete=complete.check_names, help="Skip these checks (comma separated).")
@node_selection
@pass_state
def check(
    state: State,
    inventory: str | None,
    as_json: bool,
    only: str | None,
    skip: str | None,
    include: str | None,
    exclude: str | None,
    first: str | None,
    master: str | None,
) -> None:
    from ..config.overrides import apply

    inv = apply(resolve_inventory(inventory), overrides_from(include, exclude, first, master))
    from ..preflight.runner import run_preflight, select_checks

    select_checks(split_names(only), split_names(skip))  # an unknown name: exit 2 before any connection
    from ..run.supervise import sigterm_as_interrupt
    from ..transport import transport_of

    with sigterm_as_interrupt(), transport_of(inv).hold(inv, render.allocation_line) as held:  # Slurm: an allocation
        inv = held.inventory
        with render.probe_progress(len(inv.nodes)) as progress:
            report = run_preflight(
                inv,
                only=split_names(only),
                skip=split_names(skip),
                progress=progress,
                warm_up=None if as_json else render.preload_check_table,
            )
    if as_json:
        render.json_out(report.to_json(inv.path))
    else:
        render.check_table(report)
        if report.fabric is not None:
            render.fabric_report(report.fabric)
    raise SystemExit(ExitCode.OK if report.ok else ExitCode.FAILED)


UP_HELP = f"""Check, assign ranks, launch torchrun on every node, stream the merged log, supervise.

\b
Node ranks follow the inventory (the master is node rank 0). One node failing stops all.
Words after `--` are appended to the job's arguments for this run; a trainer setting given
there replaces the inventory's (every spelling: --batch, --batch-size, batch=).
When job.sync lists paths, they are copied to every node first (orch sync), then checked.
Exit code: 0 success everywhere, 1 the job failed, 2 bad inventory, 3 preflight or sync
failed (nothing launched), 130 interrupted (every node stopped first).

\b
Hang watchdog: when no rank writes a line for job.stall_timeout_s ({default("job.stall_timeout_s")}; --stall-timeout;
counted from the first line of any rank), every rank's stack is taken (orch stacks) and the
run stops (job.on_stall: stop) or goes on (warn).
Retries: after a failure (not a sync or preflight failure) the run is torn down, synced and
checked again and relaunched under the same run id, up to job.retries times (--retries); the
trainer gets --resume auto and continues its own last.pt; a node that now fails the sync or preflight is replaced by
a `spare:` node.

\b
Examples:
  orch up inventory/v100.yaml --dry-run     # the plan: ranks and exact commands (env values as ***)
  orch up inventory/v100.yaml --dry-run --json --show-env   # the plan JSON, env values included
  orch up inventory/v100.yaml               # launch and follow
  orch up inventory/v100.yaml --detach      # launch, return; then orch logs -f
  orch up inventory/v100.yaml --fabric      # measure the fabric in the preflight first
  orch up inventory/v100.yaml --retries 2 --stall-timeout 900
  orch up inventory/v100.yaml -- --epochs 1 --batch 64   # replaces the inventory's batch
  orch up inventory/v100.yaml --exclude v100-2 --env NCCL_DEBUG=INFO
  orch up inventory/v100.yaml --nodes 2 --dry-run        # the first two nodes, ranks re-planned
"""


@cli.command(help=UP_HELP, cls=_CommandAfterDashes, context_settings=CONTEXT)
@click.argument("inventory", required=False, shell_complete=complete.inventory_files)
@click.option("--dry-run", is_flag=True, help="Print the plan (node, address, ranks, command); touch no node.")
@click.option("--detach", is_flag=True, help="Return once every node has started; the job keeps running.")
@click.option("--skip-checks", is_flag=True, help="Launch without the preflight.")
@click.option("--skip-sync", is_flag=True, help="Do not copy job.sync to the nodes first.")
@click.option("--run-id", help="Name the run (default: DATE-TIME-CLUSTER).")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: print the plan as JSON.")
@click.option(
    "--show-env",
    is_flag=True,
    help="With --dry-run: print the inventory's env values (hidden as *** by default: they are often tokens and keys).",
)
@click.option(
    "--fabric",
    is_flag=True,
    help="Also run the fabric check in the preflight (a short all_reduce job on every node); "
    "a failure stops the launch (exit 3).",
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    metavar="N",
    help=f"Relaunch the run up to N times after a failure (default: job.retries, {default('job.retries')}).",
)
@click.option(
    "--stall-timeout",
    type=Number(min=0),
    metavar="SECONDS",
    help="Call the run hung when no rank writes a line this long; 0 = off "
    f"(default: job.stall_timeout_s, {default('job.stall_timeout_s')}).",
)
@node_selection
@click.option(
    "--env",
    "env",
    multiple=True,
    metavar="NAME=VALUE",
    help="Add to the job's environment for this run (over the inventory's env); repeatable.",
)
@click.pass_context
def up(
    ctx: click.Context,
    inventory: str | None,
    dry_run: bool,
    detach: bool,
    skip_checks: bool,
    skip_sync: bool,
    run_id: str | None,
    as_json: bool,
    fabric: bool,
    retries: int | None,
    stall_timeout: float | None,
    show_env: bool,
    include: str | None,
    exclude: str | None,
    first: str | None,
    master: str | None,
    env: tuple[str, ...],
) -> None:
    from ..config.overrides import apply

    overrides = overrides_from(include, exclude, first, master, env, ctx.meta.get("orch.command"))
    if run_id is not None:
        from ..store import check_run_id

        check_run_id(run_id, "--run-id")
    if detach and (retries or stall_timeout):
        raise UsageError(
            "--retries and --stall-timeout need an attached orch up: a detached run has nobody watching it",
            "drop --detach, or drop those flags",
        )
    if show_env and not dry_run:
        raise UsageError(
            "--show-env goes with --dry-run: it prints the plan's env values", "orch up INVENTORY --dry-run --show-env"
        )
    if as_json and not dry_run:  # accepted and ignored, a launch would print the human output
        raise UsageError(
            "--json goes with --dry-run: it prints the plan as JSON, a launch has no JSON output",
            "orch up INVENTORY --dry-run --json for the plan; orch status RUN --json for a run's state",
        )
    inv = apply(resolve_inventory(inventory), overrides)
    if dry_run:
        from ..config.plan import make_plan
        from ..transport import transport_of

        kind = transport_of(inv)
        inv = kind.peek(inv)  # inside a Slurm allocation: its nodes (nothing is asked of Slurm)
        lines = kind.plan_lines(inv)  # the commands here that get the nodes and launch (sbatch, srun)
        plan = make_plan(inv, run_id or "dry-run") if inv.nodes else None
        if as_json:
            shown = plan.to_json(env_values=show_env) if plan is not None else {"nodes": []}
            more = {"launch": lines} if lines else {}
            render.json_out({**shown, **more, "overrides": overrides.to_json(env_values=show_env)})
        else:
            if plan is not None:
                render.plan_table(plan, env_values=show_env)
            render.launch_lines(lines, planned=plan is not None)
            render.overrides_note(overrides)
        raise SystemExit(ExitCode.OK)
    from ..up import up as run_up

    printer = render.UpPrinter()
    try:
        outcome = run_up(
            inv,
            detach=detach,
            skip_checks=skip_checks,
            run_id=run_id,
            skip_sync=skip_sync,
            progress=printer,
            fabric=fabric,
            retries=retries,
            stall_timeout_s=stall_timeout,
            overrides=None if overrides.empty else overrides.to_json(),
        )
    finally:
        printer.live.clear()  # the outcome (or the interruption) is written where the live line was
    render.up_outcome(outcome)
    if outcome.result == "detached" and inv.job.retries:
        render.not_retried_detached(inv.job.retries)
    raise SystemExit(UP_EXIT[outcome.result])


LOGS_HELP = """Merged, time-ordered logs of a run (the latest when RUN is omitted).

\b
Every line: node UTC time, node, rank, text. Lines are ordered by the time the node wrote
them, corrected by the clock offsets the last `orch check` measured (said on stderr when they
differ by 1 ms or more between nodes; -v: always). Control characters in a
job's text (escape sequences, CR, C1, bidi overrides) are shown escaped (`\\x1b`); --raw
writes them as the job wrote them (--json keeps them, escaped by JSON).

\b
Examples:
  orch logs --follow
  orch logs 20261130-093205-v100 --node v100-[2-3] --grep 'loss|Error'
  orch logs --rank 0 --tail 50 --json
  orch logs --follow --no-telemetry           # the job's own lines only
"""


@cli.command(help=LOGS_HELP, cls=complete.Remembering, context_settings=CONTEXT)
@click.argument("run", required=False, shell_complete=complete.run_ids)
@click.option("-f", "--follow", is_flag=True, help="Keep following every node live until the run ends or Ctrl-C.")
@click.option(
    "--node",
    "node_filter",
    shell_complete=complete.node_names,
    help="Only these nodes (name or range, e.g. gpu[01-02]).",
)
@click.option("--rank", "rank_filter", help="Only these global ranks (e.g. 0 or 0,8-15).")
@click.option("--grep", help="Only lines matching this regular expression.")
@click.option("--since", help="Only lines newer than this (e.g. 10m, 2h, or 2026-11-30T09:30:00).")
@click.option("--tail", type=int, help="Only the last N lines of each node.")
@click.option(
    "--no-telemetry",
    "no_telemetry",
    is_flag=True,
    help="Leave out the node agents' telemetry lines and the ranks' timing lines (what orch top reads).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line on stdout.")
@click.option(
    "--skew-correct/--no-skew-correct",
    default=None,
    help="Subtract measured clock offsets before ordering (default: on when known).",
)
@click.option(
    "--watermark",
    type=Number(),
    default=1.0,
    show_default=True,
    help="Seconds a live line may be held back to order it among nodes.",
)
@click.option(
    "--raw",
    is_flag=True,
    help="Write each line's text as the job wrote it, control characters included (for a file; never coloured).",
)
@pass_state
def logs(
    state: State,
    run: str | None,
    follow: bool,
    node_filter: str | None,
    rank_filter: str | None,
    grep: str | None,
    since: str | None,
    tail: int | None,
    no_telemetry: bool,
    as_json: bool,
    skew_correct: bool | None,
    watermark: float,
    raw: bool,
) -> None:
    from ..logs.view import RunLogs

    if raw and as_json:
        raise UsageError("--raw and --json together", "--json keeps every character already (escaped by JSON)")
    view = RunLogs.open(run, skew_correct, warn=render.logs_warning)
    if view.offsets_ms and (view.reorders or state.verbose):  # offsets within measurement noise: said with -v only
        render.skew_note(
            view.offsets_ms, view.offsets_origin, view.offset_reference, view.controller_offset_ms, every=state.verbose
        )
    keep = view.line_filter(node_filter, rank_filter, grep, since, metrics=not no_telemetry)
    if tail is not None and tail < 0:
        raise UsageError(f"--tail {tail}: must be 0 or more", "e.g. --tail 50: the last 50 lines of each node")
    out = render.LogPrinter(view.widths, as_json=as_json, raw=raw)
    try:
        # Ctrl-C ends a follow with exit code 0 wherever it comes: while --tail's lines are
        # printed as well as once the live ones flow (tail -f's and kubectl logs -f's way out)
        with view.cluster() as cluster, contextlib.suppress(KeyboardInterrupt) if follow else contextlib.nullcontext():
            for name, exc in view.fetch(cluster).failed.items():
                render.fetch_failed(name, exc)
            if not follow or tail is not None:
                if keep.empty and tail is None and out.plain:  # stdout gets exactly merged.log's text
                    out.chunks(view.plain(raw))
                else:
                    out.lines(view.lines(keep, tail))
            if follow:
                with contextlib.closing(
                    view.follow(cluster, watermark=watermark, from_start=tail is None, on_event=render.log_event)
                ) as live:
                    out.lines((line for line in live if keep(line)), flush_each=True)
                ended = view.state()
                render.logs_drained(view.run.run_id, ended)
                raise SystemExit(FOLLOW_EXIT.get(ended, ExitCode.FAILED))
    except BrokenPipeError:
        render.silence_stdout()
    raise SystemExit(ExitCode.OK)


@cli.command(context_settings=CONTEXT)
@click.argument("run", required=False, shell_complete=complete.run_ids)
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON on stdout.")
@pass_state
def status(state: State, run: str | None, as_json: bool) -> None:
    """Per-node state of a run: state, exit code, pid, uptime, last log time; for a trainer
    run, its progress (epoch k/N, images/s, last validation mAP, ETA).

    \b
    Example:
      orch status --json | jq '.nodes[] | select(.state != "running")'
    """
    from ..logs.progress import status_progress
    from ..run.control import status as run_status

    report = run_status(run)
    progress = status_progress(report)
    if as_json:
        render.json_out({**report.to_json(), "progress": progress.to_json() if progress else None})
    else:
        render.status_table(report)
        if progress is not None:
            render.progress_note(progress, report.state)
    raise SystemExit(ExitCode.OK)


@cli.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON on stdout.")
@click.option("-a", "--all", "show_all", is_flag=True, help="Every run, not only the newest.")
@click.option(
    "-n",
    "--last",
    "last",
    type=click.IntRange(min=1),
    default=DEFAULT_RUNS,
    show_default=True,
    metavar="N",
    help="How many of the newest runs to list.",
)
@pass_state
def runs(state: State, as_json: bool, show_all: bool, last: int) -> None:
    """Every run in $ORCH_HOME, newest first, as run.json last recorded it (like `sky status`).

    Id, inventory, state, attempt, start, wall time (`running for` while it runs), nodes ×
    processes, and the first failure in a few words. Any unique prefix of an id names the run
    wherever a RUN is taken (also without its date: `1933` for the run started at 19:33), and
    `latest` the latest; `orch status RUN` asks the nodes for the live state.

    \b
    Examples:
      orch runs
      orch runs --all --json | jq -r '.runs[] | select(.state == "failed") | .run'
      orch logs 20261201-1933 --follow     # a unique prefix of the id
    """
    from ..run.history import list_runs

    report = list_runs(None if show_all else last)
    if as_json:
        render.json_out(report.to_json())
    else:
        render.runs_table(report)
    raise SystemExit(ExitCode.OK)


@cli.command(context_settings=CONTEXT)
@click.argument("run", required=False, shell_complete=complete.run_ids)
@pass_state
def down(state: State, run: str | None) -> None:
    """Stop every process of a run on every node (by its recorded process group) and wait.

    Idempotent: safe on a run that already ended.

    \b
    Example:
      orch down                # the latest run
    """
    from ..run.control import down as run_down

    result = run_down(run)
    render.down_report(result)
    raise SystemExit(ExitCode.OK if result.complete else ExitCode.FAILED)


@cli.command(context_settings=CONTEXT)
@click.argument("run", required=False, shell_complete=complete.run_ids)
@pass_state
def report(state: State, run: str | None) -> None:
    """Write a self-contained HTML report of a run into its directory.

    Node timeline, loss and mAP curves (the trainer's results.csv), per-rank throughput with
    scaling efficiency, the preflight table and the first failure. Opens offline.

    \b
    Example:
      xdg-open "$(orch report)"        # the path alone goes to stdout
    """
    from ..report import make_report

    render.report_outcome(make_report(run))
    raise SystemExit(ExitCode.OK)


@cli.command(context_settings=CONTEXT)
@click.argument("run", required=False, shell_complete=complete.run_ids)
@click.option("--json", "as_json", is_flag=True, help="Every rank's stack and the groups as JSON on stdout.")
@click.option(
    "--timeout",
    type=Number(min=1),
    default=20.0,
    show_default=True,
    metavar="SECONDS",
    help="How long py-spy may take per rank.",
)
@pass_state
def stacks(state: State, run: str | None, as_json: bool, timeout: float) -> None:
    """The Python stack of every rank on every node of a running run, grouped.

    Ranks whose main threads stand on the same frames share one line, their ranks folded
    (`ranks 0-6,8-31`); the group that differs from the rest (a hang's culprit) is marked. Taken
    with py-spy on each node (`pip install py-spy` in job.python's environment; the trainer
    extra installs it); saved in $ORCH_HOME/runs/RUN/stacks/<time>.json and .txt.

    Exit code: 0 every rank's stack taken, 1 a node or rank gave none (py-spy missing, ptrace
    refused, unreachable, nothing running: each is named), 2 unknown run.

    \b
    Examples:
      orch stacks                      # the latest run
      orch stacks 20261130-093205-v100 --json | jq '.groups[] | {ranks_text, summary}'
    """
    from ..run.stacks import stacks as take

    report = take(run, timeout)
    if as_json:
        render.json_out(report.to_json())
    else:
        render.stacks_view(report)
    raise SystemExit(ExitCode.OK if report.complete else ExitCode.FAILED)


@cli.command(context_settings=CONTEXT)
@click.argument("run", required=False)
@click.option("--once", is_flag=True, help="Print one table and exit (no live view).")
@click.option("--json", "as_json", is_flag=True, help="One look as JSON on stdout (implies --once).")
@click.option("--gpus", is_flag=True, help="One row per GPU instead of one per node.")
@click.option(
    "--interval",
    type=Number(min=0.5),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="How often the live view fetches the node logs again.",
)
@pass_state
def top(state: State, run: str | None, once: bool, as_json: bool, gpus: bool, interval: float) -> None:
    """The whole cluster while it trains: GPUs, CPU, ranks, stragglers, one row per node.

    Read from the node logs (the agents' telemetry lines every job.telemetry_s, the trainer's
    timing lines), fetched like `orch logs` does: works for a detached run, from any shell, after
    the controller restarted. Columns: GPU utilisation, memory, power and temperature (the worst
    GPU of the node; every GPU with --gpus), the node's CPU, the ranks' images/s and data wait,
    the age of the node's last line. Flags: `throttle` (a GPU's clocks are held down), `hot`,
    `idle-gpu` (a GPU idle while its rank runs), `gpu-error`, `straggler` (named by the
    detector: job.straggler), `stale` (no telemetry for 3 intervals). Ctrl-C leaves the live view.

    Exit code: 0 · 2 unknown run.

    \b
    Examples:
      orch top                                  # live, the latest run
      orch top --once --gpus                    # one table, a row per GPU
      orch top --json | jq '.nodes[] | select(.flags != []) | {node, flags}'
    """
    from ..top import TopView, top_once

    if as_json or once:
        report = top_once(run)
        if as_json:
            render.json_out(report.to_json())
        else:
            render.top_table(report, gpus)
        raise SystemExit(ExitCode.OK)
    frames = TopView.open(run).frames(interval)
    with contextlib.suppress(KeyboardInterrupt):
        render.top_live(frames, gpus)
    raise SystemExit(ExitCode.OK)


EXEC_HELP = """Run a command on every node in parallel; each line shown as it arrives (`node: line`).

\b
The command goes after `--`. One argument is a line for each node's login shell, as
pdsh and ssh send it (quote it: pipes and globs run on the node); several arguments are
an argv, each word reaching the node as it is. It runs in the node's login environment
(the inventory's `env` is not applied) with an empty stdin, over the same SSH settings
and host-key rules as every orch command.

\b
Output is live, as pdsh and clush print it: `node: line` the moment a node's line is
complete, stdout lines on stdout, stderr lines on stderr. With -b/--gather (clush's flag)
nodes that print the same stdout and stderr and exit alike are shown once, after all have
answered, under their folded names (node[1-3,5]), like `pdsh | dshbak -c`. Control
characters in node output are shown escaped (\\x1b), never sent to the terminal.

\b
Without an inventory, -w names the hosts (pdsh/clush -w: `gpu[1-4]`, `root@login`): reached
over SSH with ~/.ssh/config and ~/.ssh/known_hosts, host keys checked strictly, as an
inventory without an `ssh:` section.

\b
Exit code: the worst node's: the largest exit code, where a node that could not be
reached (or whose command ended without an exit status) counts 255 and one that timed
out 124; 0 when every node exited 0. 2: bad usage or inventory (nothing ran).

\b
Examples:
  orch exec inventory/v100.yaml -- nvidia-smi
  orch exec -- 'pip freeze | grep torch'
  orch exec --nodes v100-[2-4] -- df -h /data
  orch exec --timeout 10 --json -- nproc | jq -r '.nodes[] | "\\(.node) \\(.stdout)"'
  orch exec -b -- nvidia-smi -L                # grouped: identical answers once
  orch exec -w gpu[1-4] -- uptime               # no inventory: hosts from ~/.ssh/config
  orch exec --env CUDA_VISIBLE_DEVICES=0 -- python -c 'import torch; print(torch.cuda.device_count())'
  orch exec --container RUN -- nvidia-smi -L     # inside RUN's container on each of its nodes
"""


@cli.command("exec", cls=_CommandAfterDashes, help=EXEC_HELP, context_settings={**CONTEXT, "allow_extra_args": True})
@click.argument("inventory", required=False, shell_complete=complete.inventory_files)
@click.option(
    "--nodes",
    "node_set",
    metavar="SET",
    shell_complete=complete.node_names,
    help="Only these nodes: names or ranges, e.g. v100-[1-2],v100-4.",
)
@click.option(
    "--timeout",
    type=Number(min=0, min_open=True),
    metavar="SECONDS",
    help="Give up on a node whose command runs longer than SECONDS (it counts exit 124).",
)
@click.option("--json", "as_json", is_flag=True, help="Print every node's answer as JSON on stdout.")
@click.option(
    "-b", "--gather", is_flag=True, help="Group identical answers once all nodes answered (clush -b, pdsh | dshbak -c)."
)
@click.option(
    "-w",
    "hosts",
    metavar="HOSTS",
    help="Hosts to run on without an inventory: names or ranges, e.g. gpu[1-4],root@login.",
)
@click.option("-l", "--user", metavar="USER", help="With -w: the login on every host (else ~/.ssh/config's).")
@click.option(
    "--env",
    "env",
    multiple=True,
    metavar="NAME=VALUE",
    help="Set this variable for the command (over the node's login environment); repeatable.",
)
@click.option(
    "--container",
    "container_run",
    metavar="RUN",
    shell_complete=complete.run_ids,
    help="Run the command inside RUN's container on each of its nodes (a job.container run).",
)
@click.pass_context
def exec_(
    ctx: click.Context,
    inventory: str | None,
    node_set: str | None,
    timeout: float | None,
    as_json: bool,
    gather: bool,
    hosts: str | None,
    user: str | None,
    env: tuple[str, ...],
    container_run: str | None,
) -> None:
    command = ctx.meta.get("orch.command")
    if not command:
        stray = f" (got: {' '.join(ctx.args)})" if ctx.args else ""
        raise UsageError(
            "no command given" if command is not None else f"put the command after --{stray}",
            "orch exec [INVENTORY] [--nodes SET] -- CMD ...   e.g. orch exec -- nvidia-smi (-w HOSTS: no inventory)",
        )
    from ..config.nodeset import select
    from ..config.overrides import parse_env
    from ..remote.exec import run_everywhere

    extra_env = parse_env(env)
    if container_run is not None:
        if inventory is not None or hosts is not None:
            raise UsageError(
                "--container RUN with an INVENTORY or -w", "--container runs on RUN's own nodes: give RUN alone"
            )
        if extra_env:
            raise UsageError(
                "--env with --container",
                "the command runs in the container's environment: "
                "set the variable in the command (orch exec --container RUN -- env X=1 CMD)",
            )
        inv, run_nodes, box = _in_container(container_run)
        nodes = select(node_set, run_nodes)
    elif hosts is not None:
        if inventory is not None:
            raise UsageError("both an INVENTORY and -w", "give one: the inventory's nodes, or -w HOSTS")
        from ..config.inventory import adhoc

        inv = adhoc(hosts, user)
    elif user is not None:
        raise UsageError("-l/--user goes with -w", "an inventory sets its login with ssh.user")
    else:
        inv = resolve_inventory(inventory, nodes=True)
    if container_run is None:
        nodes, box = select(node_set, inv.nodes), None
    from .ui import color_enabled

    if as_json or gather:
        with render.exec_progress(len(nodes)) as progress:
            report = run_everywhere(inv, nodes, command, timeout=timeout, progress=progress, env=extra_env, box=box)
        if as_json:
            render.json_out(report.to_json())
        else:
            render.exec_output(report, color_enabled(sys.stdout))
    else:
        live = render.ExecLines(color_enabled(sys.stdout))
        report = run_everywhere(inv, nodes, command, timeout=timeout, on_line=live, env=extra_env, box=box)
        live.ended(report)
    raise SystemExit(report.exit_code)


def _in_container(run: str) -> tuple[Inventory, list[Any], Any]:
    """RUN's inventory, the nodes it launched on and the way into its container on each
    (`config.jobenv.BoxExec`)."""
    from ..config.jobenv import box_exec
    from ..run.records import trusted_records
    from ..store import RunStore, recorded_nodes

    rd = RunStore().get(run)
    inv = rd.inventory()
    records = trusted_records(rd, inv, recorded_nodes(rd.read()))  # each nonce of orch's form, else exit 2
    nonce = next((r.nonce for r in records if r.nonce), None) or rd.nonce or ""
    box = box_exec(inv.job.container, rd.run_id, nonce) if inv.job.container is not None else None
    if box is None:
        enterable = " or ".join(r.name for r in RUNTIME_TABLE.values() if r.exec)
        raise UsageError(
            f"run {rd.run_id} ran no {enterable} container (job.container)",
            f"orch exec {rd.inventory_path} -- CMD runs on its nodes' hosts",
        )
    names = [r.node for r in records]
    nodes = [n for n in inv.nodes if n.name in names] or list(inv.nodes)
    return inv, nodes, box


SYNC_HELP = """Copy the inventory's `job.sync` paths to the same absolute paths on every node.

\b
Only what changed is sent (rsync's rule: size and modification time, or --checksum). A
directory /data/coco lands at /data/coco, its missing parents created. Files on a node that
the controller does not have are kept unless --delete. `orch up` runs this before its
preflight when job.sync lists anything. Two methods (--method):
  direct  rsync over SSH with the inventory's SSH settings (user, port, identity,
          known_hosts, host-key policy, gateway), one rsync per node, `fanout` nodes at
          once: this machine's link carries one copy per node. rsync on both sides.
  chain   the files some node lacks are sent once from here into a chain of those nodes
          (a relay on each, over TCP on the nodes' `addr`, each hop proving a per-transfer
          secret): each node writes what it lacks, every file checked by sha256 before it
          is renamed into place, and forwards the stream. A node that dies mid-way is
          dropped and named, the nodes after it resume. The nodes' python runs the relay.
  auto    (default) the chain for 2 nodes or more and 16 MB or more of files, else
          direct; --delete and --dry-run are direct's.

\b
Exit code: 0 every node in sync, 1 some node failed (named, with the reason), 2 bad
usage or inventory (job.sync empty, a path missing here).

\b
Examples:
  orch sync inventory/v100.yaml               # job: {sync: [/srv/yolo, /data/coco]}
  orch sync --dry-run                         # what would change on each node
  orch sync --nodes v100-[3-4] --json | jq '.nodes[] | {node, files, bytes}'
"""


@cli.command(help=SYNC_HELP, cls=complete.Remembering, context_settings=CONTEXT)
@click.argument("inventory", required=False, shell_complete=complete.inventory_files)
@click.option(
    "--nodes",
    "node_set",
    metavar="SET",
    shell_complete=complete.node_names,
    help="Only these nodes: names or ranges, e.g. v100-[1-2],v100-4.",
)
@click.option("-n", "--dry-run", is_flag=True, help="Show what would change on each node; change nothing.")
@click.option(
    "--delete", is_flag=True, help="Also remove files inside synced directories that the controller does not have."
)
@click.option("--checksum", is_flag=True, help="Compare files by checksum, not size and time (reads every file).")
@click.option(
    "--method",
    type=click.Choice(METHODS),
    default="auto",
    show_default=True,
    help="direct: rsync to each node; chain: once from here, relayed node to node; auto: the chain for 2+ nodes "
    "and 16 MB+.",
)
@click.option("--json", "as_json", is_flag=True, help="Print every node's outcome as JSON on stdout.")
def sync(
    inventory: str | None,
    node_set: str | None,
    dry_run: bool,
    delete: bool,
    checksum: bool,
    method: str,
    as_json: bool,
) -> None:
    inv = resolve_inventory(inventory, nodes=True)
    from ..config.nodeset import select
    from ..remote.sync import SyncOptions, sync_nodes

    nodes = select(node_set, inv.nodes)
    options = SyncOptions(dry_run=dry_run, delete=delete, checksum=checksum, method=method)
    with render.exec_progress(len(nodes)) as progress, render.chain_progress() as watch:
        report = sync_nodes(inv, nodes, options, progress, watch)
    if as_json:
        render.json_out(report.to_json())
    else:
        render.sync_report(report)
    raise SystemExit(ExitCode.OK if report.ok else ExitCode.FAILED)


IMAGE_HELP = """Container images on the inventory's nodes, without a registry.

\b
Examples:
  orch image push yoloe-official:latest inventory/yoloe-image.yaml --runtime docker
"""

IMAGE_PUSH_HELP = """Put a container image on every node of INVENTORY, without a registry.

\b
docker and podman: each node is asked which image ID IMAGE names there; nodes that already
hold this machine's ID are skipped. For the others the image is exported here once
(RUNTIME save, into $TMPDIR) and, by --method:
  direct  streamed over SSH into RUNTIME load on each node, at most --parallel at once
  chain   sent once from here into a chain of those nodes (a relay on each, over TCP on
          the nodes' `addr`, each hop proving a per-transfer secret), each loading it as
          it forwards it; a node that dies mid-way is dropped and named, the rest resume
  auto    (default) the chain for 2 nodes or more and an image of 16 MB or more
The ID each node then holds is checked. apptainer: IMAGE is an absolute .sif path,
compared by sha256 and copied with rsync to the same path (orch sync chains files).
One line per node. Nothing reaches a network beyond the nodes (air-gapped clusters).

\b
Stalled nodes: a node whose load takes no byte of the image for --stall-timeout seconds
(a stopped load, a hung disk, a link that carries nothing) fails with exit 124, its line
saying how far it got; the others go on. Directly, the stream to it is ended (over SSH
the load there is left as it is: look at it); by the chain, its relay ends its load and
relays on, so the nodes after it complete; apptainer's rsync copy is ended by rsync's
--timeout. A slow node that keeps taking bytes is never cut off: raise the deadline only
for a load that pauses longer (a busy disk). On a terminal each node's bytes, rate and
state are shown as the push goes.

\b
Exit code: the worst node's (0 every node holds the image; 127 the runtime is missing on a
node; 255 a node could not be reached; 124 a node's load stalled; 1 the ID differs after
loading) · 2 bad usage (no such image here, unknown runtime).

\b
Examples:
  orch image push yoloe-official:latest inventory/yoloe-image.yaml --runtime docker
  orch image push /images/yoloe.sif --runtime apptainer --nodes gpu[01-02]
  orch image push nvcr.io/nvidia/pytorch:24.05-py3 --json | jq '.nodes[] | {node, action}'
  orch image push yoloe-official:latest --stall-timeout 120   # nodes with slow, busy disks
"""


@cli.group(help=IMAGE_HELP, context_settings=CONTEXT)
def image() -> None:
    pass


@image.command("push", help=IMAGE_PUSH_HELP, cls=complete.Remembering, context_settings=CONTEXT)
@click.argument("image_ref", metavar="IMAGE")
@click.argument("inventory", required=False, shell_complete=complete.inventory_files)
@click.option(
    "--runtime",
    type=click.Choice(RUNTIMES),
    help="The container runtime (default: the inventory's job.container.runtime).",
)
@click.option(
    "--nodes",
    "node_set",
    metavar="SET",
    shell_complete=complete.node_names,
    help="Only these nodes: names or ranges, e.g. gpu[01-02],gpu07.",
)
@click.option(
    "--parallel",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    metavar="N",
    help="Nodes loading at once with --method direct (each stream is the whole image).",
)
@click.option(
    "--method",
    type=click.Choice(METHODS),
    default="auto",
    show_default=True,
    help="direct: a stream from here to each node; chain: once from here, relayed node to node; auto: the chain "
    "for 2+ nodes and 16 MB+.",
)
@click.option(
    "--stall-timeout",
    type=Number(min=1),
    default=IMAGE_STALL_S,
    show_default=True,
    metavar="SECONDS",
    help="Fail a node (exit 124) whose load takes no byte of the image this long; the others go on.",
)
@click.option("--json", "as_json", is_flag=True, help="Print every node's outcome as JSON on stdout.")
def image_push(
    image_ref: str,
    inventory: str | None,
    runtime: str | None,
    node_set: str | None,
    parallel: int,
    method: str,
    stall_timeout: float,
    as_json: bool,
) -> None:
    inv = resolve_inventory(inventory, nodes=True)
    from ..config.nodeset import select
    from ..remote.image import push_image

    if runtime is None and inv.job.container is not None:
        runtime = inv.job.container.runtime
    if runtime is None:
        raise UsageError(
            f"orch image push: {inv.path} has no job.container.runtime: which container runtime?",
            f"pass --runtime {'|'.join(RUNTIMES)}, or set job.container in the inventory",
        )
    nodes = select(node_set, inv.nodes)
    with render.exec_progress(len(nodes)) as progress, render.chain_progress() as watch:
        report = push_image(
            inv,
            nodes,
            image_ref,
            runtime,
            parallel=parallel,
            progress=progress,
            method=method,
            watch=watch,
            stall_s=stall_timeout,
        )
    if as_json:
        render.json_out(report.to_json())
    else:
        render.image_report(report)
    raise SystemExit(report.exit_code)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: renders OrchError as one line (+ hint) and maps it to its exit code."""
    verbose = "-v" in (argv or sys.argv[1:]) or "--verbose" in (argv or sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="orch", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except OrchError as exc:
        if verbose:
            traceback.print_exc()
        render.orch_error(exc.message, exc.hint)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except SystemExit:
        raise
    except Exception as exc:  # the last line of defence: one line unless --verbose
        if verbose:
            traceback.print_exc()
        render.orch_error(f"internal error: {type(exc).__name__}: {exc} (run with -v for the traceback)")
        sys.exit(ExitCode.FAILED)
    sys.exit(ExitCode.OK)


if __name__ == "__main__":
    main()
