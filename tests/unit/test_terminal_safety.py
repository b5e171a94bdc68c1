"""Nothing a node sends reaches the terminal raw: log lines (stored and live), check values and
details, failure excerpts, `orch status`, errors that quote a node. Control characters are shown
escaped; the copies keep the bytes, `--json` escapes them, `orch logs --raw` writes them."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import render
from orchestrator.logs.lines import LogLine, format_line, format_ts, printable, to_json
from orchestrator.store import remote_dir
from tests.fabric_support import fabric_outputs, fabric_result
from tests.logs_support import make_run

T0 = 1_796_031_125.0
# what a hostile or careless job prints: a window title (OSC), clear screen, cursor report,
# an 8-bit CSI (C1, U+009B), a right-to-left override, BEL, DEL, a CR redraw; and an SGR colour
EVIL = "\x1b]0;owned\x07\x1b[2J\x1b[6n\x9b31m\u202egnp.exe\x7f [link=https://x.example]click[/link]"
RED = "\x1b[31mred\x1b[0m"
REPO = Path(__file__).resolve().parents[2]


def terminal_acting(text: str) -> list[str]:
    """The characters of text a terminal would act on (C0 but TAB/newline, DEL, C1, bidi)."""
    return [
        c
        for c in text
        if (ord(c) < 0x20 and c not in "\t\n")
        or 0x7F <= ord(c) <= 0x9F
        or 0x202A <= ord(c) <= 0x202E
        or 0x2066 <= ord(c) <= 0x2069
        or c in "\u200e\u200f"
    ]


def test_printable_escapes_controls_visibly_and_keeps_tab_and_text() -> None:
    assert printable("plain text: ok é 字 █") == "plain text: ok é 字 █"
    assert printable("a\tb") == "a\tb"
    assert printable(EVIL) == (
        "\\x1b]0;owned\\x07\\x1b[2J\\x1b[6n\\x9b31m\\u202egnp.exe\\x7f [link=https://x.example]click[/link]"
    )
    assert printable("50%\r") == "50%\\r"
    assert printable("\x00\x08\x0b\x0c\x1f\x85\u200e\u200f\u2066\u2069") == (
        "\\x00\\x08\\x0b\\x0c\\x1f\\x85\\u200e\\u200f\\u2066\\u2069"
    )
    # with colour on a terminal the job's colours stay, and only if exactly SGR
    assert printable(RED + "\x1b[2J\x1b[38;5;9m!", sgr=True) == RED + "\\x1b[2J\x1b[38;5;9m!"
    assert printable(RED) == "\\x1b[31mred\\x1b[0m"
    assert printable("\x1b[1;2H\x1b[?25l\x1b[31;m", sgr=True) == "\\x1b[1;2H\\x1b[?25l\x1b[31;m"


def line(text: str, stream: str = "out") -> LogLine:
    return LogLine(T0, "n1", 0, 0, 0, stream, text)


def test_format_line_escapes_unless_raw_and_keeps_only_sgr_with_colour() -> None:
    plain = format_line(line(EVIL), False)
    assert terminal_acting(plain) == [] and "\\x1b]0;owned" in plain
    assert format_line(line(EVIL), False, raw=True).endswith(EVIL)
    coloured = format_line(line(RED + " then \x1b]0;t\x07"), True)
    assert RED in coloured and "\\x1b]0;t\\x07" in coloured and "\x07" not in coloured
    assert coloured.endswith("\x1b[0m")  # the job's colour ends with its line
    # a progress bar redrawn with CR shows its last state; no CR is left to move the cursor
    assert format_line(line("10%\r20%\r"), False).endswith(" r0 20%")


def test_json_keeps_the_text_and_escapes_every_control() -> None:
    out = to_json(line(EVIL + "\u0085"))
    assert json.loads(out)["line"] == EVIL + "\u0085"
    assert terminal_acting(out) == [], out


def test_check_table_status_outcome_and_errors_show_node_text_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.preflight.checks import CheckResult
    from orchestrator.preflight.runner import CheckReport
    from orchestrator.run.control import NodeReport, StatusReport
    from orchestrator.run.supervise import Failure
    from orchestrator.up import UpOutcome

    buf = io.StringIO()
    report = CheckReport([CheckResult("software", "n1", "fail", EVIL, "torch " + EVIL, "fix " + EVIL)])
    from rich.console import Console

    render.check_table(report, Console(file=buf, force_terminal=True, width=300))
    table = buf.getvalue()
    # the table's own colours are there (a terminal), the node's escapes are not
    assert "\x1b[" in table and "owned" in table and "\x1b]0;" not in table and "\x9b" not in table
    assert "\u202e" not in table and "\x07" not in table and "[link=https://x.example]" in table
    assert "\x1b]8;" not in table  # no hyperlink made of the node's text
    render.status_table(
        StatusReport(
            "r1",
            "failed",
            [NodeReport("n1", 0, "h", "unreachable", None, None, None, None, None, None, None, "ssh: " + EVIL)],
            {"node": "n1", "rank": 0, "exit_code": 1, "reason": EVIL},
        )
    )
    render.up_outcome(UpOutcome("failed", "r1", failure=Failure("n1", 0, "exit " + EVIL, 1, 0, 0, [EVIL, "ok"])))
    render.orch_error("n1: the node agent failed: " + EVIL, "hint " + EVIL)
    out = capsys.readouterr()
    for text in (out.out, out.err):
        assert terminal_acting(text) == [], text
    assert out.err.count("\\x1b]0;owned") == 4 and "orch: n1: the node agent failed: \\x1b]0;owned" in out.err
    assert "ssh: \\x1b]0;owned" in out.out


def test_orch_logs_escapes_by_default_raw_writes_the_bytes_json_keeps_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    os.environ["ORCH_HOME"] = str(home)
    try:
        inv, run = make_run(tmp_path, ["n1"], nproc=1)
    finally:
        del os.environ["ORCH_HOME"]
    node_dir = Path(os.path.expanduser(remote_dir(inv, inv.nodes[0], run.run_id)))
    node_dir.mkdir(parents=True)
    text = f"{format_ts(T0)} out [default0]:{EVIL}\n{format_ts(T0 + 1)} err {RED}\n"
    (node_dir / "node.log").write_text(text)
    (node_dir / "state.json").write_text('{"state": "succeeded"}')
    env = dict(os.environ, ORCH_HOME=str(home), NO_COLOR="1")

    def logs(*args: str, pure: bool = False) -> subprocess.CompletedProcess[bytes]:
        e = dict(env, ORCH_PURE_PYTHON="1") if pure else env
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", "logs", run.run_id, *args],
            cwd=REPO,
            env=e,
            capture_output=True,
            timeout=120,
        )

    for pure in (False, True):  # the C merge and the Python one
        out = logs(pure=pure)
        assert out.returncode == 0, out.stderr
        shown = out.stdout.decode()
        assert terminal_acting(shown) == [] and "\\x1b]0;owned\\x07" in shown and "\\x1b[31mred" in shown
        merged = run.merged_log.read_text()
        assert merged == shown  # merged.log holds what orch logs prints: cat-ing it is as safe
    raw = logs("--raw").stdout.decode()
    assert EVIL in raw and RED in raw
    assert logs("--raw", "--node", "n1").stdout.decode() == raw  # the general path agrees
    assert logs("--no-telemetry").stdout.decode() == shown  # no telemetry lines here: the same lines
    filtered = logs("--grep", "owned").stdout.decode()
    assert terminal_acting(filtered) == [] and "owned" in filtered
    js = logs("--json").stdout.decode()
    assert terminal_acting(js) == [] and [json.loads(x)["line"] for x in js.splitlines()] == [EVIL, RED]
    both = logs("--raw", "--json")
    assert both.returncode == 2 and b"--raw and --json" in both.stderr
    # the node's copy keeps every byte as written
    assert (run.path / "nodes" / "n1.log").read_text() == text


# ----------------------------------------------------------------------------- the fabric check's output


SGR = __import__("re").compile("\x1b\\[[0-9;]*m")


def acting_but_sgr(text: str) -> list[str]:
    """What a terminal would act on, less exact SGR colour sequences (what orch's own tables use)."""
    return terminal_acting(SGR.sub("", text))


def test_image_push_shows_what_a_node_answered_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """`orch image push`'s lines: the ID a node said it held before, its error and the chain's notes
    are the node's words, shown escaped on every line (its IDs included)."""
    from orchestrator.remote.chain import ChainSummary
    from orchestrator.remote.image import ImageReport, NodePush

    nodes = (
        NodePush("n1", "loaded", "a" * 64, EVIL, elapsed_s=1.0),
        NodePush("n2", "present", EVIL, EVIL),
        NodePush("n3", "failed", None, EVIL, "load exited 125: " + EVIL, "hint " + EVIL, 125),
    )
    chain = ChainSummary((("n1", "n3"),), (("n1",),), 10, ("n3 dropped: " + EVIL,), None)
    render.image_report(ImageReport("img", "podman", EVIL, 10, nodes, 1.0, "chain", "x", chain))
    out = capsys.readouterr()
    assert terminal_acting(out.out + out.err) == [], repr(out.out)
    assert "(was \\x1b]0;owned\\x07\\x1" in out.out, out.out


def test_fabric_names_devices_and_reasons_from_the_node_are_shown_escaped() -> None:
    """`\\x1b]0;PWNED\\x1b[2J` as the job's backend, device, a node's host and a skip reason went
    out as bytes: it retitled the window and cleared the screen."""
    pwned = "\x1b]0;PWNED\x1b[2J"
    _, shown = fabric_outputs(
        ["n1", "n2"], fabric_result(["n1" + pwned, "n2"], "gloo" + pwned, "cpu" + pwned, "slow" + pwned)
    )
    assert acting_but_sgr(shown) == [] and "\x1b]0;" not in shown
    assert shown.count("\\x1b]0;PWNED\\x1b[2J") >= 4, shown


BROKEN = {
    "a sweep that is not a list": lambda r: r.update(sweep="rows"),
    "a world size as text": lambda r: r.update(world_size="8"),
    "a list": lambda r: r.clear() or r.update(x=[]),
    "a node id as text": lambda r: r["nodes"][0].update(node="0"),
    "a zero time (divides by zero)": lambda r: r["sweep"][0].update(time_us=0),
    "no ranks": lambda r: r.update(world_size=0),
    "a transfer from a node it does not list": lambda r: r["links"]["transfers"][0].update(src_node=7),
    "no sweep": lambda r: r.pop("sweep"),
    "a NaN rate": lambda r: r["sweep"][0].update(busbw_gbps=float("nan")),
}


@pytest.mark.parametrize("what", list(BROKEN))
def test_a_fabric_result_of_the_wrong_shape_fails_the_check_on_rank_0s_node(what: str) -> None:
    result = fabric_result(["n1", "n2"])
    BROKEN[what](result)
    results, shown = fabric_outputs(["n1", "n2"], result)
    assert results["n1"].status == "fail"
    assert results["n1"].detail.startswith("the fabric job's result is not what orch's job writes: result")
    assert results["n2"].status == "fail" and "stopped after the job failed on n1" in results["n2"].detail
    assert "preflight failed" in SGR.sub("", shown) and "fabric: no measurement" in shown


# ----------------------------------------------------------------------------- any bytes a node can send

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("ORCH_HYPOTHESIS_EXAMPLES", 300))
NODE_BYTES = st.one_of(
    st.binary(max_size=40),
    st.text(
        alphabet=st.sampled_from(list("\x1b\x07\x9b\x9d\x85\x00\x08\r\n\t\x7f\u202e\u2066\u200f[]]m;0123 abc字")),
        max_size=40,
    ).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.sampled_from(
        [
            EVIL.encode(),
            RED.encode(),
            b"\x1b]0;PWNED\x1b[2J",
            b"\x1b]8;;http://x\x1b\\click\x1b]8;;\x1b\\",
            b"\xc2\x9b31m",
            b"\x1bP+q\x1b\\",
        ]
    ),
)
TEXT = NODE_BYTES.map(lambda b: b.decode("utf-8", "replace"))


@settings(
    max_examples=max(20, EXAMPLES // 5),
    deadline=None,  # each example draws five kinds of table
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(line=TEXT, dump=TEXT, words=st.lists(TEXT, min_size=8, max_size=8), out=NODE_BYTES, err=NODE_BYTES)
def test_node_output_is_data_never_terminal_control(
    capsys: pytest.CaptureFixture[str], line: str, dump: str, words: list[str], out: bytes, err: bytes
) -> None:
    """Log lines, probe answers, the fabric job's JSON, py-spy's dumps and `orch exec` output, each
    whatever bytes a node sends: what reaches a person has no ESC, BEL or C1 control of the node's
    (a colour terminal: no control but orch's own exact SGR colours)."""
    from rich.console import Console

    from orchestrator.config.inventory import parse
    from orchestrator.logs.lines import parse_node_line
    from orchestrator.preflight import checks, facts, shapes
    from orchestrator.preflight.runner import CheckReport
    from orchestrator.remote.exec import ExecReport, NodeOutput
    from orchestrator.run.stacks import StacksReport, node_stacks
    from orchestrator.run.supervise import Failure
    from orchestrator.up import UpOutcome

    shown: list[str] = []
    coloured: list[str] = []
    # a log line, as written to node.log (a stamp, or a torn line), plain and on a colour terminal
    for raw in (line, f"2026-11-30T09:32:05.123456Z err {line}"):
        ln = parse_node_line(raw, "n1", 0, 0, fallback_ts=T0)
        shown.append(format_line(ln, False))
        coloured.append(format_line(ln, True))
    # the probe's answer: every check judges it, the table shows it
    inv = parse(
        "nodes: [{host: h1, gpus: 1}, {host: h2, gpus: 1}]\nchecks: {timezone: UTC}\nenv: {NCCL_SOCKET_IFNAME: eth0}\n",
        "t.yaml",
    )
    got = {}
    raws = [
        {
            "tz": {"TZ": words[0], "abbr": words[1], "utcoffset": words[2]},
            "env": {"NCCL_SOCKET_IFNAME": words[3]},
            "software": {"torch": words[4], "python": words[5]},
            "host": words[6],
            "gpus": {"source": "nvidia-smi", "query": {"rc": 0, "out": words[7] + "\n" + dump, "err": line}},
            "python": {"executable": words[0], "version": words[1]},
        },
        {"tz": words[2]},
    ]
    for n, raw in zip(inv.nodes, raws):
        nf = facts.NodeFacts(n, ssh_offset_ms=0.0, rtt_ms=1.0, connect_ms=1.0)
        nf.raw, nf.malformed = shapes.read_answer(raw, checks.FACTS_SHAPE, "facts")
        got[n.name] = nf
    report = CheckReport(checks.run_checks(inv, got, [c for c in checks.CHECKS if c != "fabric"]))
    buf = io.StringIO()
    render.check_table(report, Console(file=buf, force_terminal=True, width=200))
    coloured.append(buf.getvalue())
    # the fabric job's JSON and its log
    coloured.append(
        fabric_outputs(
            ["n1", "n2"],
            fabric_result(["n1", words[0]], words[1], words[2], words[3]),
            log=f"2026-11-30T09:32:05.123456Z err ORCH_FABRIC_ERROR "
            f"{json.dumps({'phase': words[4], 'error': words[5]})}\n{line}\n",
        )[1]
    )
    # py-spy's dumps and the agent's errors
    ranks, problem = node_stacks(
        "n1",
        0,
        {
            "py_spy": "/bin/py-spy",
            "python": words[0],
            "ranks": [
                {
                    "rank": 0,
                    "local_rank": 0,
                    "pid": 1,
                    "code": 0,
                    "dump": f'Thread 1 (idle): "{words[1]}"\n    {words[2]} ({words[3]}:7)\n{dump}',
                },
                {"rank": 1, "local_rank": 1, "pid": 2, "code": 1, "error": words[4]},
            ],
        },
    )
    buf = io.StringIO()
    render.stacks_view(
        StacksReport("r1", T0, ranks, {"n2": words[5], **({"n1": problem} if problem else {})}),
        Console(file=buf, force_terminal=True, width=200),
    )
    coloured.append(buf.getvalue())
    # orch exec: the command's own output, and an error that quotes the node
    report_exec = ExecReport(
        ("x",),
        False,
        (
            NodeOutput("n1", 3, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")),
            NodeOutput("n2", 255, "", "", "ssh: " + words[6], "hint " + words[7]),
        ),
    )
    capsys.readouterr()
    render.exec_output(report_exec, False)
    render.up_outcome(UpOutcome("failed", "r1", failure=Failure("n1", 0, "exit " + words[0], 1, 0, 0, [line, dump])))
    plain = capsys.readouterr()
    shown += [plain.out, plain.err]
    render.exec_output(report_exec, True)
    both = capsys.readouterr()
    coloured += [both.out, both.err]
    for text in shown:
        assert terminal_acting(text) == [], repr(text)
    for text in coloured:
        assert acting_but_sgr(text) == [], repr(text)
