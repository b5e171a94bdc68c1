"""Everything orch shows people: tables and progress on the terminal, `--json` alone on stdout.

The library never prints: commands return outcome objects (a CheckReport, an up outcome, a status
report...) or yield what to show, and the functions here render them, one module per command.
rich is imported inside them, so a command that draws nothing (`orch check --json` in a pipe)
never loads it. Every name is also this package's (`render.up_outcome`), as the commands call them.

- `common.py` text from a node made safe (`safe`, `markup`, `printable`), orch's error line,
              `--json` output, a line alone on stdout
- `check.py`  `orch check`: the check table, the failures' recap, the fabric check's report
- `logs.py`   `orch logs`: the merged log's lines, the clock skew note, the follow's events
- `up.py`     `orch up`: the dry run's plan, the live progress, how the run ended
- `runs.py`   `orch status`, `orch runs`, `orch down`, `orch stacks`, `orch report`
- `top.py`    `orch top`: nodes, GPUs and ranks, once or live
- `remote.py` `orch exec`, `orch sync`, `orch image push`

Text that comes from a node (log lines, a check's value, detail and hint, a failure's excerpt and
reason, errors quoting a node's stderr) is shown through `safe` (`logs.lines.printable`): no
escape sequence a job prints reaches the terminal. Where rich draws it, it is also markup-escaped.
"""

from __future__ import annotations

from .check import (
    RECAP_LINES,
    check_table,
    fabric_report,
    failures_recap,
    preload_check_table,
    probe_progress,
)
from .common import (
    click_stdout,
    json_out,
    markup,
    orch_error,
    printable,
    safe,
    silence_stdout,
    strict,
)
from .logs import (
    LogPrinter,
    fetch_failed,
    log_event,
    logs_drained,
    logs_warning,
    skew_note,
)
from .remote import (
    ExecLines,
    chain_lines,
    chain_progress,
    describe_transfer,
    exec_failures,
    exec_output,
    exec_progress,
    failed_tail,
    human_bytes,
    image_report,
    sync_report,
)
from .runs import (
    down_report,
    duration,
    failure_head,
    progress_note,
    progress_text,
    report_outcome,
    runs_table,
    stacks_view,
    status_table,
)
from .top import (
    top_live,
    top_renderable,
    top_table,
)
from .up import (
    LiveLine,
    UpPrinter,
    allocation_line,
    launch_lines,
    node_stopped_text,
    not_retried_detached,
    overrides_note,
    plan_table,
    shutil_width,
    up_outcome,
)

__all__ = [
    "safe",
    "markup",
    "orch_error",
    "strict",
    "json_out",
    "silence_stdout",
    "click_stdout",
    "printable",
    "check_table",
    "RECAP_LINES",
    "failures_recap",
    "fabric_report",
    "preload_check_table",
    "probe_progress",
    "LogPrinter",
    "skew_note",
    "fetch_failed",
    "log_event",
    "logs_drained",
    "logs_warning",
    "plan_table",
    "overrides_note",
    "LiveLine",
    "shutil_width",
    "UpPrinter",
    "allocation_line",
    "launch_lines",
    "node_stopped_text",
    "up_outcome",
    "not_retried_detached",
    "stacks_view",
    "failure_head",
    "status_table",
    "duration",
    "runs_table",
    "progress_text",
    "progress_note",
    "down_report",
    "report_outcome",
    "top_renderable",
    "top_table",
    "top_live",
    "exec_output",
    "ExecLines",
    "exec_failures",
    "exec_progress",
    "human_bytes",
    "describe_transfer",
    "image_report",
    "failed_tail",
    "sync_report",
    "chain_progress",
    "chain_lines",
]
