"""docs/inventory.md's key tables, generated from the schema: every key's path, type, default and
meaning as `schema.py` declares them (its class attributes and the docstring under each key).

Regenerate after changing a key: `python -m orchestrator.config.reference` (rewrites the part of
docs/inventory.md between `BEGIN` and `END`); tests/unit/test_inventory_reference.py fails while
the page and the schema differ.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from ..contract import CHECK_NAMES
from .schema import (
    SSH_UNSET,
    ChecksModel,
    InventoryModel,
    JobModel,
    MasterModel,
    NodeModel,
    Scalar,
    SlurmModel,
    SSHModel,
    _is_schema,
    field_docs,
    fields_of,
    yaml_text,
)

BEGIN = (
    "<!-- BEGIN keys: generated from orchestrator/config/schema.py by "
    "`python -m orchestrator.config.reference`; edit the schema, not this table -->"
)
END = "<!-- END keys -->"
SECTIONS: tuple[tuple[str, str, type], ...] = (
    ("Top level", "", InventoryModel),
    ("ssh", "ssh.", SSHModel),
    ("nodes[]", "nodes[].", NodeModel),
    ("slurm", "slurm.", SlurmModel),
    ("master", "master.", MasterModel),
    ("checks", "checks.", ChecksModel),
    ("job", "job.", JobModel),
)
"""Each table of the page: its heading, the key prefix, the schema class whose keys it lists. A key
whose value is a mapping of its own is listed with its keys in its section (the top level names
it); `nodes[]` lists the node's own keys and one row for the `ssh` keys it may override."""
NAMED = {"checks.skip": lambda: ", ".join(f"`{name}`" for name in CHECK_NAMES)}
"""Keys whose meaning ends with a list defined elsewhere (the check names: `contract.CHECK_NAMES`)."""
PAGE = Path(__file__).resolve().parents[2] / "docs" / "inventory.md"
_WORDS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null", Any: "any"}


def type_text(tp: Any) -> str:
    """A declared type as the table words it: `integer`, `integer or string`, `` `warn` or `stop` ``;
    None is left out (the default column says what unset means)."""
    if tp in _WORDS:
        return _WORDS[tp]
    if _is_schema(tp):
        return "node" if tp is NodeModel else "mapping"
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin is list:
        inner = type_text(args[0])
        return f"list of {inner}s" if " " not in inner else f"list of ({inner})"
    if origin is dict:
        return "mapping"
    if origin is Union or origin is types.UnionType:
        members = [a for a in args if a is not type(None)]
        scalars = set(get_args(Scalar))
        every = scalars <= set(members)  # str | int | float | bool: a scalar
        words = [type_text(a) for a in members if not (every and a in scalars)]
        return " or ".join(words + ["scalar"] * every)
    return str(tp)


def default_text(schema: type, key: str) -> str:
    """A key's default as the table shows it: `required`, an inventory's spelling of the value, or
    `—` when unset means something the key's doc says."""
    if not hasattr(schema, key):
        return "required"
    value = getattr(schema, key)
    if value is None and schema is SSHModel and key in SSH_UNSET:
        value = SSH_UNSET[key]
    if value is None or _is_schema(type(value)):
        return "—"
    return f"`{yaml_text(value)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _rows(schema: type, prefix: str, top: bool) -> list[tuple[str, str, str, str]]:
    """The rows of `schema`'s keys under `prefix`. At the top level a key whose value is a mapping
    links to its section; below it, that mapping's keys follow it, and a mapping that only groups
    keys (`checks.clock`) has no row of its own. `nodes[]` lists the node's own keys and one row
    for the `ssh` keys a node may override."""
    docs = field_docs(schema)
    inherited = [k for k in fields_of(SSHModel) if schema is NodeModel]
    rows = []
    for key, tp in fields_of(schema).items():
        if key in inherited:
            continue
        path, sub = f"{prefix}{key}", _unwrap_schema(tp)
        doc = f"{docs[key]}: {NAMED[path]()}" if path in NAMED else docs[key]
        if top and sub is not None:
            doc += f" ([below](#{_anchor(key)}))"
        nested = sub if sub is not None and not top and schema is not NodeModel else None
        if nested is None or tp is not nested:
            rows.append((f"`{path}`", type_text(tp), default_text(schema, key), doc))
        if nested is not None:
            rows += _rows(nested, f"{path}.", False)
    if inherited:
        rows.append(
            (
                f"`{prefix}{{{','.join(inherited)}}}`",
                "as in `ssh`",
                "from `ssh`",
                "the node's own value of that `ssh` key",
            )
        )
    return rows


def _unwrap_schema(tp: Any) -> type | None:
    if _is_schema(tp):
        return tp
    for arg in get_args(tp):
        found = _unwrap_schema(arg)
        if found is not None:
            return found
    return None


def _anchor(key: str) -> str:
    return {"nodes": "nodes", "spare": "nodes"}.get(key, key)


def tables() -> str:
    """The generated part of docs/inventory.md, markers included."""
    out = [BEGIN]
    for title, prefix, schema in SECTIONS:
        heading = f"`{title}`" if title != "Top level" else title
        out += ["", f"## {heading}", ""]
        doc = (schema.__doc__ or "").strip()
        if doc and schema is not InventoryModel:
            out += [" ".join(doc.split()), ""]
        out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        out += [f"| {' | '.join(_cell(c) for c in row)} |" for row in _rows(schema, prefix, schema is InventoryModel)]
    out += ["", END]
    return "\n".join(out)


def updated(page: str) -> str:
    """The page with its generated part replaced by `tables()` (ValueError without the markers)."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError("docs/inventory.md lost its BEGIN/END markers")
    return page[:start] + tables() + page[end + len(END) :]


def generated(page: str) -> str:
    """The generated part of a page as it is (for the test comparing it with `tables()`)."""
    start, end = page.find(BEGIN), page.find(END)
    return page[start : end + len(END)] if 0 <= start < end else ""


if __name__ == "__main__":
    PAGE.write_text(updated(PAGE.read_text()))
