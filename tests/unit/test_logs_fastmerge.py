"""The C merge (`orchestrator.stored._fastmerge`, what `orch logs RUN > file` and merged.log run when the
install could build it) prints exactly the bytes of the general path (parse every line into a
LogLine, k-way merge, `format_line`), for any bytes a node.log copy can hold."""

from __future__ import annotations

import os
import shutil
import sysconfig
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.logs import stored
from orchestrator.logs.fetch import NodeSource
from orchestrator.logs.lines import _UNSAFE, column_widths, format_ts
from orchestrator.logs.merge import PlainNode, merge_plain
from orchestrator.logs.stored import plain_merged, plain_merged_bytes
from tests.cluster import missing
from tests.hypothesis_support import examples
from tests.logs_support import general_merge

T0 = 1_796_031_125.0  # 2026-11-30T09:32:05Z


def test_the_extension_is_built_where_a_compiler_is() -> None:
    # CI installs gcc and the Python headers: there, a silently missing extension is a failure
    compiler = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0])
    headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    if compiler is None or not headers:
        missing("no C compiler or Python headers: orch runs the pure-Python merge (test_logs_plain)")
    assert stored._fastmerge is not None, "setup.py did not build orchestrator.stored._fastmerge"


fast = pytest.mark.skipif(stored._fastmerge is None, reason="orchestrator.stored._fastmerge is not built")


def c_merge(
    texts: list[bytes], nodes: list[PlainNode], widths: tuple[int, int], block: int, chunk: int, raw: bool = False
) -> bytes:
    assert stored._fastmerge is not None
    with tempfile.TemporaryDirectory() as d:
        handles = []
        for i, t in enumerate(texts):
            Path(d, f"{i}.log").write_bytes(t)
            handles.append(open(Path(d, f"{i}.log"), "rb"))  # noqa: SIM115
        try:
            return b"".join(
                stored._fastmerge.PlainMerge(
                    handles,
                    [f" {n.node.ljust(widths[0])} ".encode() for n in nodes],
                    [n.base_rank for n in nodes],
                    [n.offset_ms for n in nodes],
                    widths[1],
                    block=block,
                    chunk=chunk,
                    raw=raw,
                )
            )
        finally:
            for h in handles:
                h.close()


stamp = st.integers(0, 40).map(lambda us10: format_ts(T0 + us10 * 0.25))
odd_stamp = st.sampled_from(
    [
        "2024-02-29T00:00:00.000001Z",
        "2023-02-29T00:00:00.000001Z",
        "0000-01-01T00:00:00.000000Z",
        "0001-01-01T00:00:00.000000Z",
        "2026-11-30T23:59:60.000000Z",
        "2026-11-30T23:59:61.999999Z",
        "2026-11-30T23:59:62.000000Z",
        "9999-12-31T23:59:61.999999Z",
        "1969-12-31T23:59:59.999999Z",
        "2026-11-30T24:00:00.000000Z",
        "2026-11-31T09:32:05.000000Z",
        "2026-00-10T09:32:05.000000Z",
        "1900-02-29T09:32:05.000000Z",
        "2000-02-29T09:32:05.000000Z",
        "2026-11-30T09:60:05.000000Z",
    ]
)
prefix = st.sampled_from(
    [
        "",
        "[default0]:",
        "[default3]:",
        "[trainer12]:",
        "[rank 5] ",
        "[default1]:[rank 9] ",
        "[default٣]:",
        "[W1130 warn] ",
        "[default2]:[rank x] ",
        "[rank 007] ",
        "[rank 5000] ",
        "[default4999]:",
        "[rank 123456789012345678901234567890] ",
        "[default99999999999999999999]:",
        "[_-x-7]:",
        "[-x7]:",
        "[default7]",
        "[rank 5]",
        "[default0]:[rank 12]:",
        "[a1]:[rank 2] [rank 3] ",
    ]
)
stream = st.sampled_from(["out", "err", "orch", "", "weird-stream", "é\x00", "\r"])
# the text: what a terminal must never get raw (ESC and whole sequences, BEL, CR, DEL, C1 as
# U+0080-U+009F, bidi marks and overrides) beside what it may (TAB, SGR colour, é, 字, U+2028)
text = st.lists(
    st.sampled_from(
        [
            "a",
            "b",
            " ",
            "[",
            "]",
            "\r",
            "\t",
            ":",
            "é",
            "字",
            "\x00",
            "\x1b",
            "\x07",
            "\x7f",
            "\x80",
            "\x85",
            "\x9b",
            "\x9f",
            "\xa0",
            "\u200e",
            "\u200f",
            "\u202a",
            "\u202e",
            "\u2066",
            "\u2069",
            "\u2028",
            "\u206a",
            "\\",
            "\x1b[31m",
            "\x1b]0;title\x07",
            "\x1b[2J",
        ]
    ),
    max_size=12,
).map("".join)
junk = st.sampled_from(
    [
        b"\xff",
        b"\xe2\x82",
        b"\xed\xa0\x80",
        b"\xc0\xaf",
        b"\xf4\x90\x80\x80",
        b"\xe2\x82\xac",
        b"\xf0\x9f\x98\x80",
        b"\xf0\x9f\x98",
        b"\x80",
        b"\xc3",
        b"\x9b",
        b"\xc2",
        b"\xc2\x1b",
        b"\xe2\x80",
        b"\xe2\x80\xae",
        b"\x1b",
        b"\x7f",
    ]
)
valid = st.builds(
    lambda s, m, p, t: f"{s} {m} {p}{t}".encode(), st.one_of(stamp, stamp, stamp, odd_stamp), stream, prefix, text
)
with_junk = st.builds(lambda line, j, at: line[:at] + j + line[at:], valid, junk, st.integers(0, 60))
odd = st.sampled_from(
    [
        b"",
        b"torn line",
        b"2026-11-30T09:32:05.12345Z out short",
        b"2026-11-30T09:32:05.123456Zout",
        b"2026-11-30T09:32:05.123456Z",
        b"2026-11-30T09:32:05.123456Z ",
        b"2026-11-30T09:32:05.123456Z  two spaces",
        b"2026-11-30T09:32:05.+12345Z out plus",
        b"2026-11-30T09:32:05.123456Z out progress 1%\r2%\r\r",
        b"\r\r\r",
        b"x" * 300,
        b"2026-11-30T09:32:05.123456Z out " + b"y" * 200 + b"\rz",
    ]
)
node_text = st.tuples(st.lists(st.one_of(valid, valid, valid, with_junk, odd), max_size=25), st.booleans())


@settings(max_examples=examples(400), deadline=None)
@given(
    st.lists(node_text, min_size=1, max_size=5),
    st.lists(st.sampled_from([0.0, 0.0, 0.25, -3.5, 1000.0]), min_size=5, max_size=5),
    st.lists(st.one_of(st.none(), st.integers(0, 64), st.just(10**12)), min_size=5, max_size=5),
    st.sampled_from([16, 40, 100, 1 << 16]),
    st.sampled_from([1, 64, 1 << 20]),
    st.booleans(),
)
@fast
def test_c_merge_prints_exactly_what_the_general_path_prints(
    per_node: list[tuple[list[bytes], bool]],
    offsets: list[float],
    bases: list[int | None],
    block: int,
    chunk: int,
    raw: bool,
) -> None:
    names = [f"node{i}" if i % 2 else f"n{i}é" for i in range(len(per_node))]
    nodes = [PlainNode(name, bases[i], offsets[i]) for i, name in enumerate(names)]
    texts = [b"\n".join(lines) + (b"\n" if end and lines else b"") for lines, end in per_node]
    widths = column_widths(names, 70)
    expected = general_merge([t.decode("utf-8", "replace") for t in texts], nodes, widths, raw).encode()
    got = c_merge(texts, nodes, widths, block, chunk, raw)
    assert got == expected
    # and the Python block merge (the fallback) agrees on the same bytes, leap seconds and all
    decoded = [[t.decode("utf-8", "replace") + ("\n" if t and not t.endswith(b"\n") else "")] for t in texts]
    assert "".join(merge_plain(decoded, nodes, widths, raw)).encode() == expected
    if not raw:  # nothing a terminal acts on is left: no control byte but TAB and the newlines
        out = got.decode()
        assert _UNSAFE.search(out.replace("\n", "")) is None, out


@fast
def test_the_c_merge_reads_the_worker_field_as_the_agent_defines_it() -> None:
    """The C merge's worker field (`is_role_first`, `is_role`, the digits, `]:`) is
    node/agent.py's `WORKER_FIELD`: every byte, first in the role, later in it, beside the digits
    and the brackets, makes a worker's line in C exactly where it does in Python."""
    heads = []
    for b in range(256):
        c = bytes([b])
        heads += [b"[" + c + b"3]:", b"[a" + c + b"3]:", b"[a" + c + b"]:", b"[a3" + c + b"]:"]
        heads += [b"[a3]" + c, c + b"a3]:"]
    heads += [b"[3]:", b"[]:", b"[a-3]:", b"[_3]:", b"[-a3]:", b"[a3]:[a4]:", b"[default99999999999999999999]:"]
    lines = [b"%s out %sx\n" % (format_ts(T0 + i * 1e-6).encode(), h) for i, h in enumerate(heads)]
    nodes = [PlainNode("n0", 8)]
    widths = column_widths(["n0"], 100)
    text = b"".join(lines)
    expected = general_merge([text.decode("utf-8", "replace")], nodes, widths).encode()
    assert c_merge([text], nodes, widths, 1 << 16, 1 << 20) == expected
    workers = expected.count(b" r11 x\n")  # local rank 3 on a node whose base rank is 8
    assert workers > 100 and len(heads) - workers > 1000  # both kinds, not a test that cannot fail


@fast
def test_a_rank_of_more_digits_than_a_number_takes_is_no_rank_in_every_merge() -> None:
    """A job that prints `[rank <5000 digits>] ` (or a worker field that long): Python's int()
    refuses more than 4300 digits, and `orch logs`, merged.log and the live view used to stop on
    that ValueError. Each merge now shows the line with no rank, the same bytes."""
    big = "9" * 5000
    lines = [
        f"{format_ts(T0)} out [default0]:[rank {big}] hi\n",
        f"{format_ts(T0 + 1e-6)} out [default{big}]:ho\n",
        f"{format_ts(T0 + 2e-6)} out [default1]:[rank 12] fine\n",
    ]
    nodes = [PlainNode("n0", 8)]
    widths = column_widths(["n0"], 16)
    expected = general_merge(["".join(lines)], nodes, widths)
    assert expected.splitlines() == [
        f"{format_ts(T0)} n0   - hi",
        f"{format_ts(T0 + 1e-6)} n0   - ho",
        f"{format_ts(T0 + 2e-6)} n0 r12 fine",
    ]
    assert c_merge(["".join(lines).encode()], nodes, widths, 1 << 16, 1 << 20) == expected.encode()
    assert "".join(merge_plain([lines], nodes, widths)) == expected


@fast
def test_escape_sequences_from_a_job_reach_neither_the_merged_text_nor_a_terminal() -> None:
    line = ("2026-11-30T09:32:05.123456Z out [default0]:\x1b]0;owned\x07\x1b[2J\x9b6n\u202egnp.exe\tok\x7f\n").encode()
    nodes = [PlainNode("n0", 0)]
    safe = "2026-11-30T09:32:05.123456Z n0 r0 \\x1b]0;owned\\x07\\x1b[2J\\x9b6n\\u202egnp.exe\tok\\x7f\n"
    assert c_merge([line], nodes, (2, 2), 1 << 16, 1 << 20).decode() == safe
    assert "".join(merge_plain([[line.decode()]], nodes, (2, 2))) == safe
    assert (
        c_merge([line], nodes, (2, 2), 1 << 16, 1 << 20, raw=True) == b"2026-11-30T09:32:05.123456Z n0 r0 " + line[43:]
    )


@fast
def test_ties_go_to_the_node_given_first_and_chunks_hold_whole_lines() -> None:
    same = format_ts(T0).encode()
    texts = [b"".join(same + b" out b%d\n" % i for i in range(3000)), same + b" out a1\n"]
    nodes = [PlainNode("b", None), PlainNode("a", None)]
    got = c_merge(texts, nodes, (1, 1), 16, 4096)
    lines = got.decode().splitlines()
    assert lines[:3] == [f"{format_ts(T0)} b - b0", f"{format_ts(T0)} b - b1", f"{format_ts(T0)} b - b2"]
    assert lines[-1].endswith(" a - a1") and len(lines) == 3001
    assert stored._fastmerge is not None
    with open(os.devnull, "rb") as empty:
        assert list(stored._fastmerge.PlainMerge([empty], [b" x "], [0], [0.0], 1)) == []


def copies(tmp_path: Path, texts: list[bytes]) -> list[NodeSource]:
    out = []
    for i, t in enumerate(texts):
        p = tmp_path / f"n{i}.log"
        p.write_bytes(t)
        out.append(NodeSource(f"n{i}", i, 8 * i, "", "", p))
    out.append(NodeSource("never-fetched", 9, 72, "", "", tmp_path / "missing.log"))
    return out


def test_plain_merged_bytes_is_the_python_merge_with_or_without_the_extension(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = [
        b"".join(
            b"%s out [default%d]:step %d\xff\x1b[2J\n" % (format_ts(T0 + k * 0.003 + i * 0.001).encode(), k % 8, k)
            for k in range(5000)
        )
        for i in range(3)
    ]
    sources = copies(tmp_path, texts)
    widths = column_widths([s.node for s in sources], 80)
    for offsets, raw in (({}, False), ({"n1": 2.5, "never-fetched": 1.0}, False), ({}, True)):
        python = "".join(plain_merged(sources, offsets, widths, raw)).encode()
        assert python.count(b"\n") == 15000 and "\ufffd".encode() in python
        assert (b"\x1b" in python) == raw and (b"\\x1b" in python) != raw
        assert b"".join(plain_merged_bytes(sources, offsets, widths, raw)) == python
        monkeypatch.setenv("ORCH_PURE_PYTHON", "1")
        assert not stored.fast_merge_available()
        assert b"".join(plain_merged_bytes(sources, offsets, widths, raw)) == python
        monkeypatch.delenv("ORCH_PURE_PYTHON")
