"""The plain-text block merge (`orch logs` without filters) prints exactly what the general path
(parse every line into a LogLine, k-way merge, `format_line`) prints, for any input."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.logs.lines import column_widths, format_ts
from orchestrator.logs.merge import PlainNode, merge_plain
from tests.hypothesis_support import examples
from tests.logs_support import general_merge

T0 = 1_796_031_125.0  # 2026-11-30T09:32:05Z


def blocks(text: str, cuts: list[int]) -> list[str]:
    """Split a node's text into blocks of whole lines at the given line counts (a torn last line
    gets its newline, as the file reader does)."""
    lines = [line + "\n" for line in text.split("\n")]  # on newlines only, as the node copy is read
    if lines[-1] == "\n":
        lines.pop()
    out, start = [], 0
    for c in cuts:
        out.append("".join(lines[start : start + c]))
        start += c
    out.append("".join(lines[start:]))
    return [b for b in out if b]


# One node.log line: a valid stamp (times chosen so that ties and steps back happen) with a
# stream and the prefixes torchrun and the trainer write, or something torn or odd.
stamp = st.integers(0, 40).map(lambda us10: format_ts(T0 + us10 * 0.25))
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
    ]
)
stream = st.sampled_from(["out", "err", "orch", "", "weird-stream"])
text = st.text(st.sampled_from("ab [] \r\t:é字\x1b\x07\x7f\x85\x9b\u202e\u2066\\"), max_size=12)
valid = st.builds(lambda s, m, p, t: f"{s} {m} {p}{t}", stamp, stream, prefix, text)
odd = st.sampled_from(
    [
        "",
        "torn line",
        "2026-13-30T09:32:05.123456Z out bad month",
        "2026-11-30T09:32:05.12345Z out short µs",
        "2026-11-30T09:32:05.123456Zout",
        "2026-11-30T09:32:05.123456Z",
        "2026-11-30T09:32:05.123456Z ",
        "2026-11-30T09:32:05.123456Z  two spaces",
        "2026-11-30T09:32:05.+12345Z out plus",
        "2026-11-30T09:32:05.123456Z out progress 1%\r2%\r\r",
    ]
)
node_text = st.lists(st.one_of(valid, valid, valid, odd), max_size=25).flatmap(
    lambda ls: st.tuples(st.just(ls), st.lists(st.integers(1, 6), max_size=5), st.booleans())
)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(node_text, min_size=1, max_size=5),
    st.lists(st.sampled_from([0.0, 0.0, 0.25, -3.5, 1000.0]), min_size=5, max_size=5),
    st.lists(st.one_of(st.none(), st.integers(0, 64)), min_size=5, max_size=5),
    st.booleans(),
)
def test_block_merge_prints_exactly_what_the_general_path_prints(
    per_node: list[tuple[list[str], list[int], bool]], offsets: list[float], bases: list[int | None], raw: bool
) -> None:
    names = [f"node{i}" if i % 2 else f"n{i}" for i in range(len(per_node))]
    nodes = [PlainNode(name, bases[i], offsets[i]) for i, name in enumerate(names)]
    texts = ["\n".join(lines) + ("\n" if newline_at_end and lines else "") for lines, _c, newline_at_end in per_node]
    widths = column_widths(names, 70)
    expected = general_merge(texts, nodes, widths, raw)
    got = "".join(merge_plain([blocks(t, cuts) for t, (_l, cuts, _n) in zip(texts, per_node)], nodes, widths, raw))
    assert got == expected


def test_ties_go_to_the_node_given_first_even_across_blocks() -> None:
    same = format_ts(T0)
    a = f"{same} out a1\n{same} out a2\n"
    b = f"{same} out b1\n"
    nodes = [PlainNode("b", None), PlainNode("a", None)]
    got = "".join(merge_plain([[b], [a[: a.index("\n") + 1], a[a.index("\n") + 1 :]]], nodes, (1, 1)))
    assert [line.split()[-1] for line in got.splitlines()] == ["b1", "a1", "a2"]


def test_memory_is_bounded_by_the_blocks_not_the_log() -> None:
    # 3 nodes x 2000 blocks of 10 lines: the merge consumes its inputs lazily and yields as it goes
    pulled = [0, 0, 0]

    def source(i: int):  # type: ignore[no-untyped-def]
        for b in range(2000):
            pulled[i] += 1
            yield "".join(f"{format_ts(T0 + b + k / 10 + i / 100)} out x\n" for k in range(10))

    out = merge_plain([source(i) for i in range(3)], [PlainNode(f"n{i}", 0) for i in range(3)], (2, 2))
    first = next(out)
    assert first.count("\n") <= 30
    assert max(pulled) <= 2
    assert sum(chunk.count("\n") for chunk in out) + first.count("\n") == 60_000
