"""Safe YAML loading that remembers where every key and item came from.

The inventory's error messages name file, line and key; PyYAML's safe loader forgets lines once it
builds plain dicts, so we compose the node graph ourselves and keep a side table
`{path tuple: line}` (1-based). Duplicate keys, which PyYAML silently collapses, are errors here.

Aliases are held to what a person writes: an alias inside the value it names (`&a [1, *a]`, a
cycle) is refused at its line, and so is one that makes the document expand past `MAX_VALUES`
values (nested aliases grow exponentially: 330 bytes can name millions of values), both while
composing, before anything is built; nesting deeper than `MAX_DEPTH` is refused the same way.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

Path = tuple[str | int, ...]

MAX_VALUES = 100_000
"""The most values (scalars, lists, mappings) a document may expand to once its aliases are
followed. An inventory of 4 × 8-GPU servers has a few hundred."""
MAX_DEPTH = 64
"""The deepest nesting of lists and mappings a document may have."""


class YamlError(Exception):
    """A YAML syntax or structure error at a line (1-based, or None when unknown)."""

    def __init__(self, message: str, line: int | None, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.key = key


def load(text: str) -> tuple[Any, dict[Path, int]]:
    """Parse one YAML document with the safe loader; return (data, {path: line}). Anything YAML
    refuses (syntax, a tag it cannot build, a character it cannot hold) is a YamlError."""
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (a control character)
        raise _unreadable(text, exc) from None
    lines: dict[Path, int] = {}
    try:
        root = loader.get_single_node()
        if root is None:
            return None, lines
        lines[()] = root.start_mark.line + 1
        return _build(loader, root, (), lines), lines
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        context = ""
        started = exc.context_mark.line + 1 if exc.context_mark is not None else None
        if exc.context and started is not None:
            context = f" ({exc.context} started at line {started})"
        cause = likely_cause(text, str(exc.problem or exc), line, started)
        raise YamlError(
            f"YAML syntax error: {exc.problem or exc}{context}" + (f"; {cause}" if cause else ""), line
        ) from None
    except yaml.reader.ReaderError as exc:
        raise _unreadable(text, exc) from None
    finally:
        loader.dispose()


_NO_SPACE = re.compile(r"^\s*(?:-\s+)?([A-Za-z0-9_.-]+):(?!\s|//)\S")
"""`key:value`: YAML reads one word, not a key and its value (a URL's `://` is not this)."""


def likely_cause(text: str, problem: str, line: int | None, started: int | None) -> str | None:
    """What usually causes this syntax error, pointing at the line to fix: a tab in the
    indentation, a missing space after a colon, a line indented off its neighbours, a quote or
    bracket never closed, a value with `: ` that needs quotes."""
    lines = text.splitlines()
    if line is None or not 1 <= line <= len(lines) + 1:
        return None
    for n in (line, line - 1):
        if 1 <= n <= len(lines) and "\t" in lines[n - 1][: len(lines[n - 1]) - len(lines[n - 1].lstrip())]:
            return f"line {n} is indented with a tab: YAML indents with spaces only"
    if "'\\t'" in problem or "\t" in problem:
        return "a tab: YAML indents with spaces only"
    before = [n for n in range(line, max(0, line - 3), -1) if 1 <= n <= len(lines) and lines[n - 1].strip()]
    for n in before:
        m = _NO_SPACE.match(lines[n - 1])
        if m and ": " not in lines[n - 1].split("#", 1)[0]:
            word = lines[n - 1].strip().removeprefix("- ").split()[0]
            return (
                f"usually a missing space after a colon: line {n} has `{word}`, which YAML reads as one word; "
                f"write `{m.group(1)}: {word.split(':', 1)[1]}`"
            )
    if "quoted scalar" in problem or ("end of stream" in problem and started is not None):
        return f"usually a quote opened at line {started} that is never closed"
    if "flow" in problem or problem.startswith("expected ',' or"):
        return f"usually a {{ or [ opened at line {started} that is not closed, or a ': ' inside it"
    if problem.startswith("mapping values are not allowed"):
        return (
            f"usually line {line} is indented deeper than the key above it, or a value there holds ': ' "
            "and needs quotes ('a: b')"
        )
    if "block end" in problem or "expected key" in problem or "expected ':'" in problem:
        return (
            f"usually indentation: line {line} does not line up with the keys beside it"
            + (f" (the block that started at line {started})" if started else "")
            + "; keys of one mapping start in the same column"
        )
    return None


def _unreadable(text: str, exc: yaml.reader.ReaderError) -> YamlError:
    """A character YAML does not allow (a control character), at its line."""
    shown = repr(chr(exc.character)) if isinstance(exc.character, int) else repr(exc.character)
    return YamlError(f"YAML cannot hold the character {shown}: {exc.reason}", text.count("\n", 0, exc.position) + 1)


class _Loader(yaml.SafeLoader):
    """The safe loader, counting as it composes: each alias adds the values it stands for, an
    alias to a value still being composed is a cycle; either past its limit is a YamlError at the
    alias's line."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._values = 0  # the document's values so far, each alias counted as what it expands to
        self._sizes: dict[int, int] = {}  # id(node) -> the values it expands to
        self._open: set[str] = set()  # anchors whose value is being composed
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            line = event.start_mark.line + 1
            if event.anchor in self._open:
                raise YamlError(
                    f"recursive alias *{event.anchor}: it stands for a value it is part of "
                    f"(&{event.anchor} at line {self.anchors[event.anchor].start_mark.line + 1})",
                    line,
                )
            node = super().compose_node(parent, index)
            self._values += self._sizes.get(id(node), 1)
            if self._values > MAX_VALUES:
                raise YamlError(
                    f"alias *{event.anchor} makes the document expand to more than {MAX_VALUES} values "
                    "(aliases inside aliases multiply): write the values out, or alias fewer levels",
                    line,
                )
            return node
        event = self.peek_event()
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YamlError(f"nested more than {MAX_DEPTH} levels deep", event.start_mark.line + 1)
        anchor = event.anchor
        if anchor is not None:
            self._open.add(anchor)
        before = self._values
        self._values += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open.discard(anchor)
        self._sizes[id(node)] = self._values - before
        return node


def _build(loader: yaml.SafeLoader, node: yaml.Node, path: Path, lines: dict[Path, int]) -> Any:
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # resolves `<<: *anchor` merges
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                kind = "a list" if isinstance(key_node, yaml.SequenceNode) else "a mapping"
                raise YamlError(f"keys must be strings, got {kind}", line)
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise YamlError(f"keys must be strings, got {key!r}", line, str(key))
            if key in out:
                raise YamlError(f"duplicate key '{key}'", line, _dotted(path + (key,)))
            lines[path + (key,)] = line
            out[key] = _build(loader, value_node, path + (key,), lines)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            items.append(_build(loader, item, path + (i,), lines))
        return items
    return loader.construct_object(node, deep=True)


def _dotted(path: Path) -> str:
    out = ""
    for part in path:
        if not isinstance(part, int) and not part.isprintable():
            part = repr(part)  # a key with a newline or a control character stays on one line, visibly
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def dotted(path: Path) -> str:
    """`('nodes', 2, 'gpus')` → `nodes[2].gpus`, the way errors name a key."""
    return _dotted(path)


def line_of(lines: dict[Path, int], path: Path) -> int | None:
    """The line of `path`, else of its nearest ancestor that has one."""
    p = tuple(path)
    while p:
        if p in lines:
            return lines[p]
        p = p[:-1]
    return lines.get(())
