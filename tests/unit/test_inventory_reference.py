"""inventory/README.md cannot drift from the schema: every key documented, every documented key real."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.config import schema as inv_mod
from orchestrator.contract import CHECK_NAMES

DOC = (Path(__file__).resolve().parents[2] / "inventory" / "README.md").read_text()


def check_keys() -> set[str]:
    """`clock.ntp_server`-style dotted keys of the `checks:` mapping."""
    keys = set()
    for name, sub in inv_mod.fields_of(inv_mod.ChecksModel).items():
        schema = inv_mod._unwrap(sub)  # `fabric: true` or a mapping: both the key and its settings
        if inv_mod._is_schema(schema):
            keys |= {f"{name}.{k}" for k in inv_mod.fields_of(schema)}
            if schema is not sub:
                keys.add(name)
        else:
            keys.add(name)
    return keys


def section(title: str) -> str:
    m = re.search(rf"^## `?{re.escape(title)}`?.*?$(.*?)(?=^## |\Z)", DOC, re.S | re.M)
    assert m, f"section {title} missing"
    return m.group(1)


def documented(text: str) -> set[str]:
    keys = set()
    for row in re.findall(r"^\| (`[^|]+) \|", text, re.M):
        keys |= set(re.findall(r"`([^`]+)`", row))
    return keys


def test_top_level_keys() -> None:
    assert documented(section("Top level")) == set(inv_mod.fields_of(inv_mod.InventoryModel))


def test_ssh_keys() -> None:
    assert documented(section("ssh")) == set(inv_mod.fields_of(inv_mod.SSHModel))


def test_node_keys() -> None:
    assert documented(section("nodes[]")) == set(inv_mod.fields_of(inv_mod.NodeModel))


def test_check_keys() -> None:
    assert documented(section("checks")) == check_keys()


def job_keys() -> set[str]:
    """The `job:` keys, a nested mapping's (`straggler`) as `straggler.share`."""
    keys = set()
    for name, sub in inv_mod.fields_of(inv_mod.JobModel).items():
        schema = inv_mod._unwrap(sub)
        if inv_mod._is_schema(schema):
            keys |= {f"{name}.{k}" for k in inv_mod.fields_of(schema)}
        else:
            keys.add(name)
    return keys


def test_job_keys() -> None:
    assert documented(section("job")) == job_keys()


def test_every_check_name_is_listed() -> None:
    for name in CHECK_NAMES:
        assert f"`{name}`" in section("checks")
