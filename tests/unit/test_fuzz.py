"""Fuzzing the parsers of what orch reads from outside: the inventory (YAML a person wrote), a
node.log line and the reader's frames (what a job and a node wrote), and the probe's output (what
a node answered). Whatever the input, the result is a value or one clear error a line per issue,
never a traceback. Examples are bounded (ORCH_HYPOTHESIS_EXAMPLES) to keep the suite quick."""

from __future__ import annotations

import io
import json
import math
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config import yamlines
from orchestrator.config.inventory import Inventory, parse
from orchestrator.contract import CHECK_NAMES, CHECK_STATUSES
from orchestrator.errors import InventoryError
from orchestrator.logs.fetch import ProtocolError, read_frames
from orchestrator.logs.lines import parse_node_line, read_node_lines
from orchestrator.preflight import checks, facts, shapes
from orchestrator.transport import Process, Transport
from tests.hypothesis_support import examples

EXAMPLES = examples(300)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ----------------------------------------------------------------------------- the inventory

# what people (and copy-paste) put in YAML values: every type, odd strings, controls, ranges
odd_text = st.sampled_from(
    [
        "",
        " ",
        "node1",
        "node1\n",
        "a/b",
        "../x",
        "..",
        ".",
        "~",
        "~/x",
        "h[1-3]",
        "h[3-1]",
        "h[0-99999999]",
        "h[1-2,5]",
        "h[",
        "[1-2]",
        "x;rm -rf /",
        "$(id)",
        "a b",
        "\x1b[2J",
        "é",
        "字",
        "\u202e",
        "0",
        "-1",
        "1e999",
        "null",
        "yes",
        "12:34",
        "a:b:c",
        "[::1]",
        "192.168.1.10",
        "localhost",
        "host:22",
        "x" * 300,
        "\x00",
        "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
    ]
)
scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), odd_text, st.text(max_size=20)
)
value = st.recursive(
    scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(odd_text, st.text(max_size=8)), inner, max_size=4)
    ),
    max_leaves=12,
)
KEYS = {
    "": ["name", "transport", "ssh", "nodes", "master", "env", "checks", "job", "fanout", "bogus"],
    "ssh": ["user", "port", "identity", "known_hosts", "host_key_policy", "connect_timeout", "gateway", "ssh_config"],
    "node": ["host", "name", "addr", "gpus", "env", "nproc_per_node", "python", "port", "user", "ssh", "bogus"],
    "master": ["node", "port"],
    "checks": ["clock", "timezone", "rdma", "skip", "ssh"],
    "job": [
        "workdir",
        "python",
        "nproc_per_node",
        "rdzv",
        "max_restarts",
        "module",
        "script",
        "args",
        "torchrun_args",
        "run_root",
        "stop_grace_s",
    ],
}


def section(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(KEYS[kind]), value, max_size=len(KEYS[kind]))


node = st.one_of(
    section("node"),
    st.fixed_dictionaries({"host": odd_text}, optional={"name": odd_text, "addr": odd_text, "gpus": value}),
)
document = st.fixed_dictionaries(
    {"nodes": st.one_of(st.lists(node, max_size=4), value)},
    optional={
        "name": odd_text,
        "transport": st.sampled_from(["ssh", "local", "carrier-pigeon"]),
        "ssh": st.one_of(section("ssh"), value),
        "master": st.one_of(section("master"), value),
        "env": st.one_of(st.dictionaries(odd_text, value, max_size=3), value),
        "checks": st.one_of(section("checks"), value),
        "job": st.one_of(section("job"), value),
        "fanout": value,
    },
)


def assert_clear(exc: InventoryError) -> None:
    """One line per issue, each naming the file."""
    assert exc.issues
    for issue in exc.issues:
        line = issue.render()
        assert "\n" not in line and line.startswith("inv.yaml"), repr(line)


@FUZZ
@given(document)
def test_inventory_documents_load_or_fail_with_one_line_per_issue(doc: dict[str, Any]) -> None:
    text = yaml.safe_dump(doc, allow_unicode=True)
    try:
        inv = parse(text, "inv.yaml")
    except InventoryError as exc:
        assert_clear(exc)
        return
    assert isinstance(inv, Inventory) and inv.nodes and len({n.name for n in inv.nodes}) == len(inv.nodes)
    for n in inv.nodes:  # what becomes a path on a node or in $ORCH_HOME, and a column of every log line
        assert "\n" not in n.name and "/" not in n.name and n.name not in (".", "..") and n.name.isprintable()


@FUZZ
@given(
    st.one_of(
        st.text(max_size=300),
        st.lists(
            st.sampled_from(
                [
                    "nodes:",
                    "  - host: a",
                    "- host: b",
                    "name: x",
                    "  name: [",
                    "{",
                    "}",
                    "&a x",
                    "*a",
                    "<<: *a",
                    "? x",
                    ": y",
                    "'",
                    '"',
                    "\t",
                    "---",
                    "...",
                    "!!python/object:os.system",
                    "nodes: !!binary aGk=",
                    "%YAML 1.1",
                    "env: {A: 1, A: 2}",
                    "1: 2",
                    "[1,2]: x",
                    "job: {args: [x]}",
                    "args: &a [1, *a]",
                    "ssh: &s {<<: *s}",
                    "x: &b {k: [*b]}",
                    "? &k [*k]\n: 1",
                    "a: &x [" + "1," * 9 + "1]",
                    "b: &y [" + "*x," * 9 + "*x]",
                    "c: &z [" + "*y," * 9 + "*y]",
                    "d: [" + "*z," * 9 + "*z]",
                    "[" * 80 + "]" * 80,
                ]
            ),
            max_size=12,
        ).map("\n".join),
    )
)
def test_inventory_text_loads_or_fails_with_one_line_per_issue(text: str) -> None:
    try:
        parse(text, "inv.yaml")
    except InventoryError as exc:
        assert_clear(exc)


def alias_bomb(width: int, depth: int) -> str:
    """`depth` levels of aliases, each a list of `width` aliases of the level below: width**depth values."""
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, depth)]
    return "\n".join(["nodes: [{host: h1}]", *lines, f"job: {{args: {{v: *l{depth - 1}}}}}"]) + "\n"


@FUZZ
@given(st.integers(2, 12), st.integers(1, 9))
def test_aliases_expand_within_a_cap_or_fail_at_the_line_of_the_alias(width: int, depth: int) -> None:
    text = alias_bomb(width, depth)
    try:
        parse(text, "inv.yaml")
    except InventoryError as exc:
        assert_clear(exc)
        if width**depth > yamlines.MAX_VALUES:
            [issue] = exc.issues
            assert issue.line is not None and 2 <= issue.line <= depth + 2
            assert f"more than {yamlines.MAX_VALUES} values" in issue.render()


@FUZZ
@given(
    st.sampled_from(
        [
            "args: &a [1, *a]",
            "args: &a {k: *a}",
            "args: &a [[[*a]]]",
            "args: &a {<<: *a}",
            "args: &a [1, {k: [2, *a]}]",
            "? &a [*a]\n: 1",
        ]
    ),
    st.integers(0, 3),
)
def test_a_recursive_alias_is_refused_at_its_line(shape: str, padding: int) -> None:
    text = "nodes: [{host: h1}]\n" + "\n" * padding + "job:\n" + "".join(f"  {ln}\n" for ln in shape.split("\n"))
    with pytest.raises(InventoryError) as exc:
        parse(text, "inv.yaml")
    [issue] = exc.value.issues
    assert issue.render().startswith(f"inv.yaml:{padding + 3}: ") and "recursive alias *a" in issue.render()


def test_an_alias_bomb_is_refused_while_composing_before_anything_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """330 bytes that would name 9**6 = 531441 values: refused before a single value is built (a
    timed look, not an assertion: tests/unit/test_fuzz.py -s prints it)."""
    monkeypatch.setattr(yamlines, "_build", lambda *a: pytest.fail("the document was built"))
    text = alias_bomb(9, 6)
    assert len(text) < 400
    start = time.perf_counter()
    with pytest.raises(yamlines.YamlError) as exc:
        yamlines.load(text)
    print(f"alias bomb of {len(text)} bytes refused in {time.perf_counter() - start:.3f} s")
    assert exc.value.line == 7 and "alias *l4 makes the document expand to more than 100000 values" in exc.value.message
    # the same aliases, fewer of them, load: a document well under the cap is not refused
    monkeypatch.undo()
    data, _ = yamlines.load(alias_bomb(9, 3))
    assert len(data["job"]["args"]["v"]) == 9


def test_a_huge_range_is_refused_before_it_is_expanded() -> None:
    with pytest.raises(InventoryError) as exc:
        parse("nodes:\n  - host: h[0-99999999]\n", "inv.yaml")
    assert "nodes[0].host" in str(exc.value) and "100000000 nodes" in str(exc.value)


@pytest.mark.parametrize("name", ["node1\n", "a\nb", "node\x1b[2J", "n1 ", "n\u202e1"])
def test_names_that_would_become_paths_or_columns_are_refused(name: str) -> None:
    text = yaml.safe_dump({"nodes": [{"host": "h1", "name": name}]})
    with pytest.raises(InventoryError) as exc:
        parse(text, "inv.yaml")
    assert_clear(exc.value)
    env = yaml.safe_dump({"nodes": [{"host": "h1"}], "env": {name.strip() + "\n" if name.strip() else "A\n": "1"}})
    with pytest.raises(InventoryError) as exc:
        parse(env, "inv.yaml")
    assert_clear(exc.value)


# ----------------------------------------------------------------------------- node.log lines and frames

line_text = st.one_of(
    st.text(max_size=80),
    st.builds(
        lambda s, rest: s + rest,
        st.sampled_from(
            [
                "2026-11-30T09:32:05.123456Z",
                "2026-13-30T09:32:05.123456Z",
                "0000-00-00T00:00:00.000000Z",
                "9999-12-31T23:59:61.999999Z",
                "2026-11-30T09:32:05.12345Z",
                "２０２６-11-30T09:32:05.123456Z",
                "2026-11-30T09:32:05.123456Z ",
            ]
        ),
        st.text(
            alphabet=st.sampled_from(list(" out err [default0]:[rank 99999999999999999999] \r\x1b\x00é")), max_size=40
        ),
    ),
)


@FUZZ
@given(st.lists(line_text, max_size=20), st.one_of(st.none(), st.integers(0, 2**64)))
def test_node_log_lines_always_parse_to_a_line(lines: list[str], base: int | None) -> None:
    parsed = list(read_node_lines(lines, "n1", 0, base))
    assert len(parsed) == len(lines)
    for raw, got in zip(lines, parsed):
        assert got.text in raw.rstrip("\n") or raw.endswith("\n")
        try:
            again = parse_node_line(raw, "n1", 0, base)
        except ValueError as exc:
            assert "not a node.log line" in str(exc) and "\n" not in str(exc)
        else:
            assert again.ts == got.ts


HELLO = b"ORCH-LOG-READER f00d\n"
frame_bytes = st.one_of(
    st.binary(max_size=30),
    st.sampled_from(
        [
            b"D 3\nabc",
            b"D 99\nab",
            b"H running 1.5\n",
            b"S {}\n",
            b"E succeeded 2.0\n",
            b"D x\n",
            b"Traceback (most recent call last):\n",
            b"\n",
            b"D -1\n",
            b"S not json\n",
            b"H ello\n",
            b"E xpires in 3 days\n",
            b"D 99999999999999\n",
            b"D 1048577\n",
            b"H running nan\n",
            b"H \xff 1.0\n",
            b'S {"state": [1]}\n',
            b'S {"tail": 7, "exit_code": "x"}\n',
            b"ORCH-LOG-READER f00d\n",
            b"ORCH-LOG-READER beef\n",
            b"2026-11-30T09:32:05.123456Z out hi\n",
        ]
    ),
    st.builds(
        lambda d: b"S " + json.dumps(d).encode() + b"\n",
        st.dictionaries(
            st.sampled_from(
                [
                    "state",
                    "exit_code",
                    "signal",
                    "reason",
                    "pid",
                    "agent_alive",
                    "job_alive",
                    "tail",
                    "cleanup_left",
                    "now",
                    "finished_at",
                ]
            ),
            st.recursive(
                st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5)),
                lambda i: st.lists(i, max_size=2),
                max_leaves=4,
            ),
            max_size=5,
        ),
    ),
    st.builds(lambda b: b"D %d\n" % len(b) + b, st.binary(max_size=40)),
)


@FUZZ
@given(st.booleans(), st.lists(frame_bytes, max_size=10))
def test_reader_frames_parse_or_raise_a_protocol_error(hello_first: bool, chunks: list[bytes]) -> None:
    try:
        for kind, payload in read_frames(io.BytesIO((HELLO if hello_first else b"") + b"".join(chunks)), "f00d"):
            assert kind in ("D", "H", "S", "E") and isinstance(payload, bytes)
            assert kind == "D" or b"\n" not in payload
    except ProtocolError as exc:
        assert str(exc) is not None


class _Session(Process):
    def __init__(self, data: bytes) -> None:
        self.stdout = io.BytesIO(data)

    def write(self, data: bytes) -> None:
        pass

    def close_stdin(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Replay(Transport):
    """A node whose log reader says, session after session, what the test gives (its login
    shell's lines, frames, garbage), then ends a clean session; `{hello}` is the reader's first
    line with the nonce the stream chose."""

    def __init__(self, sessions: list[bytes]) -> None:
        super().__init__(INV.nodes[0])
        self.sessions = list(sessions)
        self.argvs: list[list[str]] = []

    def popen(self, argv: Any, **kw: Any) -> Process:
        self.argvs.append(list(argv))
        hello = b"ORCH-LOG-READER " + argv[-1].encode() + b"\n"
        data = self.sessions.pop(0) if self.sessions else b"{hello}E succeeded 9.0\n"
        return _Session(data.replace(b"{hello}", hello))

    def close(self) -> None:
        pass


class _NoWait(threading.Event):
    def wait(self, timeout: float | None = None) -> bool:  # the reconnect backoff, without the waiting
        return self.is_set()


@FUZZ
@given(
    st.lists(
        st.builds(
            lambda pre, hello, body: pre + (b"{hello}" if hello else b"") + body,
            st.lists(
                st.sampled_from(
                    [b"E xpires soon\n", b"H ello\n", b"D 999999999999\n", b"motd\n", b"Last login: Mon\n"]
                ),
                max_size=3,
            ).map(b"".join),
            st.booleans(),
            st.lists(frame_bytes, max_size=8).map(b"".join),
        ),
        max_size=4,
    )
)
def test_a_node_stream_survives_anything_a_node_can_send(
    tmp_path_factory: pytest.TempPathFactory, sessions: list[bytes]
) -> None:
    """The consumer, not only the parser: whatever a node's login shell and reader send, session
    after session, its NodeStream keeps reconnecting and never drops the node; the status frames
    reach the supervisor's NodeStatus, and the stream ends with the node's end."""
    from orchestrator.logs.fetch import LocalCopy, NodeSource
    from orchestrator.logs.follow import _DONE, NodeStream, _Heartbeat
    from orchestrator.logs.lines import LogLine
    from orchestrator.run.agents import NodeStatus

    copy_path = tmp_path_factory.mktemp("stream") / "n.log"
    src = NodeSource("h1", 0, 0, "/run/h1", "python3", copy_path)
    out: queue.Queue[tuple[int, Any]] = queue.Queue()
    events: list[str] = []
    statuses: list[NodeStatus] = []
    transport = _Replay(sessions)
    stream = NodeStream(
        src,
        0,
        transport,
        out,
        _NoWait(),
        poll_s=0.1,
        on_event=lambda n, m: events.append(m),
        on_status=lambda n, st: statuses.append(NodeStatus.from_json(st)),
    )
    stream._run(LocalCopy(copy_path), None, None)
    assert not [e for e in events if e.startswith("stopped following")], events
    items = []
    while not out.empty():
        items.append(out.get_nowait()[1])
    assert items[-1] is _DONE and all(isinstance(i, (LogLine, _Heartbeat)) for i in items[:-1])
    assert stream.remote_state == "succeeded"
    nonces = [argv[-1] for argv in transport.argvs]
    assert len(set(nonces)) == len(nonces) == len(transport.argvs)  # a nonce per session


# ----------------------------------------------------------------------------- the probe's answer

INV = parse(
    yaml.safe_dump(
        {
            "name": "fuzz",
            "nodes": [{"host": "h1", "gpus": 8}, {"host": "h2", "gpus": 8}],
            "env": {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5_0"},
            "checks": {"rdma": {"devices": ["mlx5_0"]}, "timezone": "UTC"},
            "job": {"args": {"data": "/data/coco.yaml", "weights": "/w/yolo.pt", "batch": 64}},
        }
    ),
    "fuzz.yaml",
)

json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False), st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=10,
)
FACT_KEYS = [
    "env",
    "tz",
    "ifaces",
    "ib",
    "gpus",
    "software",
    "ntp",
    "chrony",
    "paths",
    "workdir",
    "python",
    "listen",
    "time",
    "inventory_env",
    "home",
]
raw_facts = st.dictionaries(st.sampled_from(FACT_KEYS), json_value, max_size=len(FACT_KEYS))


class Lines:
    """A Process whose output is the given lines (what a probe, or something else, printed)."""

    def __init__(self, data: list[bytes]) -> None:
        self.data = data

    def lines(self) -> Iterator[bytes]:
        yield from self.data

    def write(self, data: bytes) -> None:
        pass


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=40),
            st.builds(
                lambda tag, v: f"{tag} {json.dumps(v)}\n".encode(),
                st.sampled_from(["ORCH-FACTS", "ORCH-LISTEN", "ORCH-REACH", "ORCH-TIME", "ORCH-ERROR"]),
                json_value,
            ),
            st.sampled_from(
                [b"ORCH-FACTS {\n", b'ORCH-TIME {"seq": "0"}\n', b'ORCH-TIME {"seq": 0, "time": "x"}\n', b"\xff\xfe\n"]
            ),
        ),
        max_size=8,
    )
)
def test_the_probe_stream_reader_takes_any_output(out: list[bytes]) -> None:
    stream = facts._Stream(Lines(out))  # type: ignore[arg-type]
    stream._wait(lambda: False, 5)
    assert stream.done
    assert all(isinstance(k, str) for k in stream.tagged) and len(stream.noise) <= 21


@FUZZ
@given(
    raw_facts,
    raw_facts,
    st.one_of(st.none(), st.floats(-1e6, 1e6)),
    st.one_of(st.none(), st.floats(0, 1e4)),
    st.one_of(
        json_value,
        st.lists(
            st.dictionaries(st.sampled_from(["kind", "ok", "port", "error", "result"]), json_value, max_size=5),
            max_size=3,
        ),
    ),
)
def test_every_check_judges_any_facts_a_probe_can_send(
    raw1: dict[str, Any], raw2: dict[str, Any], offset: float | None, rtt: float | None, reach: Any
) -> None:
    got = {}
    for n, raw in zip(INV.nodes, (raw1, raw2)):
        nf = facts.NodeFacts(n, ssh_offset_ms=offset, rtt_ms=rtt, connect_ms=rtt)
        nf.raw, nf.malformed = shapes.read_answer(raw, checks.FACTS_SHAPE, "facts")  # as _start_probe reads it
        nf.listen = nf.raw.get("listen") or {}
        nf.reach, bad = shapes.read_answer(reach, shapes.REACH_SHAPE, "reach")
        nf.malformed += bad
        got[n.name] = nf
    results = checks.run_checks(INV, got, CHECK_NAMES)
    assert {(r.check, r.node) for r in results} == {(c, n.name) for c in CHECK_NAMES for n in INV.nodes}
    assert all(r.status in CHECK_STATUSES and isinstance(r.detail, str) for r in results)
    # the checks judged the facts themselves: the last line of defence in run_checks never fired
    assert not [r for r in results if "could not judge" in r.detail], results
    for n in INV.nodes:  # a malformed answer is a failure, never silently an `ok`
        ssh = next(r for r in results if r.check == "ssh" and r.node == n.name)
        assert ssh.status == "fail" if got[n.name].malformed else ssh.status != "fail"


def test_a_probe_answer_of_the_wrong_shape_fails_ssh_and_never_passes_a_check() -> None:
    good = {"tz": {"TZ": "UTC", "localtime": None, "etc_timezone": None, "abbr": "UTC", "utcoffset": "+0000"}}
    bad = {"tz": {"TZ": ["UTC"]}, "ntp": {"offset_ms": float("nan")}, "env": {"NCCL_IB_HCA": 1}}
    got = {}
    for n, raw in zip(INV.nodes, (good, bad)):
        nf = facts.NodeFacts(n, ssh_offset_ms=0.0, rtt_ms=1.0, connect_ms=1.0)
        nf.raw, nf.malformed = shapes.read_answer(raw, checks.FACTS_SHAPE, "facts")
        got[n.name] = nf
    assert got["h2"].malformed == [
        "facts.tz.TZ: list \"['UTC']\"",
        "facts.ntp.offset_ms: float 'nan'",
        "facts.env.NCCL_IB_HCA: int '1'",
    ]
    ssh = {r.node: r for r in checks.check_ssh(INV, got)}
    assert ssh["h1"].status == "ok" and ssh["h2"].status == "fail" and "facts.tz.TZ" in ssh["h2"].detail


def test_the_reader_thread_never_outlives_its_stream() -> None:
    before = threading.active_count()
    stream = facts._Stream(Lines([b"ORCH-FACTS {}\n"]))  # type: ignore[arg-type]
    assert stream.wait_for("ORCH-FACTS", 5) == {}
    stream._wait(lambda: False, 5)
    assert threading.active_count() <= before + 1


# ----------------------------------------------------------------------------- known_hosts

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKHxEEqjT5UDO6wSh++aTO/BzQE7TbFd0nD4JyQElu4b"


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.text(max_size=60),
            st.sampled_from(
                [
                    f"h1 {KEY}",
                    f"@revoked * {KEY}",
                    f"@revoked h1 {KEY}",
                    "@revoked",
                    f"@cert-authority *.example {KEY}",
                    "@cert-authority",
                    "@bogus h1 x y",
                    "h1 ssh-ed25519 not-base64!!",
                    "h1 ssh-rsa AAAA",
                    "h1",
                    "# comment",
                    "",
                    f"|1|c2FsdA==|aGFzaA== {KEY}",
                    f"h1,h2\t{KEY}",
                    f"[h1]:2222 {KEY} comment",
                ]
            ),
        ),
        max_size=8,
    )
)
def test_known_hosts_files_are_read_line_by_line_without_an_exception(lines: list[str]) -> None:
    from orchestrator.transport.hostkeys import parse_known_hosts

    text = "\n".join(lines)
    lines = text.split("\n")
    known = parse_known_hosts("kh", text)
    revoked = any(ln.strip().startswith("@revoked ") and len(ln.split()) >= 4 for ln in lines)
    assert bool(known.revoked) == revoked
    if revoked:  # a revoked key is known for no host, whatever other line lists it
        assert known.keys_for("h1") == {} and known.keys_for("h2") == {}
    assert all(n <= len(lines) for n in known.skipped)


# ----------------------------------------------------------------------------- the fabric job's result


def _mutate(doc: Any, path: list[Any], value: Any) -> Any:
    """`doc` with the value at `path` (keys and indexes, taken modulo what is there) replaced."""
    if not path or not isinstance(doc, (dict, list)) or not doc:
        return value
    if isinstance(doc, dict):
        key = sorted(doc)[path[0] % len(doc)] if isinstance(path[0], int) else path[0]
        return {**doc, key: _mutate(doc.get(key), path[1:], value)}
    i = path[0] % len(doc) if isinstance(path[0], int) else 0
    return [*doc[:i], _mutate(doc[i], path[1:], value), *doc[i + 1 :]]


@FUZZ
@given(st.lists(st.tuples(st.lists(st.integers(0, 30), min_size=1, max_size=4), json_value), max_size=4))
def test_any_fabric_result_is_judged_and_shown_or_fails_the_check_never_a_crash(edits: list[Any]) -> None:
    """Rank 0 prints what it likes after ORCH_FABRIC_RESULT: held to its shape, the check judges
    it or fails on that node; the verdict, check.json's summary and the table never raise."""
    from tests.fabric_support import fabric_outputs, fabric_result

    doc: Any = fabric_result(["n1", "n2"])
    for path, value in edits:
        doc = _mutate(doc, path, value)
    results, shown = fabric_outputs(["n1", "n2"], doc)
    assert set(results) == {"n1", "n2"} and all(r.status in CHECK_STATUSES for r in results.values())
    if results["n1"].status == "fail" and "not what orch's job writes" in results["n1"].detail:
        assert "fabric: no measurement" in shown


# ----------------------------------------------------------------------------- telemetry and timing records

number_text = st.one_of(
    st.sampled_from(
        [
            "0",
            "1",
            "-1",
            "1e999",
            "-1e999",
            "1e308",
            "1.7e308",
            "1e-320",
            "5e-324",
            "9" * 400,
            "1.5",
            "0.0001",
            "1e9",
            "1e10",
            "1e-9",
            "1e-10",
            "nan",
            "inf",
            ".5",
            "1e",
            "--1",
            "1e+5",
            "0e0",
            str(2**53),
            str(2**53 - 1),
            "1" + "0" * 5000,
        ]
    ),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(2**80), 2**80).map(str),
)
timing_text = st.builds(
    lambda e, b, n, i, d, c, w: f"timing epoch {e} batch {b} steps {n} images {i} data_s {d} compute_s {c} wall_s {w}",
    st.sampled_from(["1", "2", "9" * 30]),
    st.sampled_from(["10", "20", "30", "40"]),
    number_text,
    number_text,
    number_text,
    number_text,
    number_text,
)
record_value = st.one_of(
    json_value,
    st.integers(-(10**400), 10**400),
    st.floats(allow_nan=True),
    st.sampled_from([10**400, -(10**400), 1e308, [[[[]]]], "NaN"]),
)
telemetry_text = st.one_of(
    st.builds(
        lambda d: "telemetry " + json.dumps(d),
        st.fixed_dictionaries(
            {},
            optional={
                k: record_value
                for k in ("gpus", "ranks", "cpu_pct", "load1", "ncpu", "mem_used_mb", "mem_total_mb", "gpu_error")
            },
        ),
    ),
    st.builds(
        lambda gpu, rank: "telemetry " + json.dumps({"gpus": [gpu], "ranks": [rank]}),
        st.dictionaries(
            st.sampled_from(
                [
                    "index",
                    "util_pct",
                    "temp_c",
                    "throttle",
                    "power_w",
                    "mem_used_mb",
                    "sm_mhz",
                    "fan_pct",
                    "name",
                    "error",
                ]
            ),
            record_value,
            max_size=6,
        ),
        st.dictionaries(st.sampled_from(["rank", "local_rank", "pid", "cpu_pct", "rss_mb"]), record_value, max_size=5),
    ),
    st.sampled_from(
        [
            "telemetry ",
            "telemetry {",
            "telemetry [1]",
            "telemetry " + "[" * 100000,
            "telemetry 1e999",
            'telemetry {"cpu_pct": 1e999, "ranks": 7, "gpus": {"a": 1}}',
        ]
    ),
)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 3), st.one_of(timing_text, telemetry_text)), max_size=40))
def test_no_record_a_node_writes_crashes_the_detector_a_verdict_or_a_table(items: list[tuple[int, str]]) -> None:
    """Whatever numbers a rank's timing line or an agent's telemetry line carry, a line is a finite
    record or ignored (counted), and what the detector names renders as a line and as strict JSON."""
    from orchestrator.logs.telemetry import Ignored, Sample, read_record
    from orchestrator.run.straggler import Detector

    det = Detector(0.8, 1, world_size=4)
    ignored = 0
    for k, (rank, text) in enumerate(items):
        stream, body = ("orch", text) if text.startswith("telemetry") else ("out", f"[rank {rank}] {text}")
        line = parse_node_line(f"2026-11-30T09:32:{k:02d}.000000Z {stream} {body}", f"n{rank}", rank, rank)
        record = read_record(line)
        assert record is not None
        if isinstance(record, Ignored):
            ignored += 1
        elif isinstance(record, Sample):
            det.load(record.load())
        else:
            window, timing = record
            figures = (
                timing.data_s,
                timing.compute_s,
                timing.wall_s,
                timing.ips,
                timing.data_share,
                timing.outside_s,
                window.outside_s,
                window.data_share,
            )
            assert all(math.isfinite(x) and x >= 0 for x in figures), timing
            for found in det.window(window):
                assert found.line().startswith(f"straggler: rank {found.rank} on ")
                json.dumps(found.to_json(), allow_nan=False)
    for _key, _at, speeds in det.speeds:
        assert all(math.isfinite(v) for v in speeds.values())
    assert ignored <= len(items)
