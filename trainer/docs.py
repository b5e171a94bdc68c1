"""docs/trainer.md's flag table, generated from ``TrainConfig`` so that each flag is written once.

``python -m trainer.docs`` prints the table; ``python -m trainer.docs --write`` puts it into
docs/trainer.md between its two marker comments (``BEGIN``, ``END``), leaving the rest of the page
as it is. tests/unit/test_docs_trainer.py fails when the page's table and the code differ.

A row per flag of ``build_parser`` in its order: the flag (its second spellings from ``ALIASES``
after it), its value, its default, the ultralytics ``key=value`` setting that sets the same thing
(``settings.FIELD_OF_SETTING``), and its help: the field's docstring.
"""

from __future__ import annotations

import argparse
import sys
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from trainer.config import ALIASES, FLAG_FIELD, TrainConfig, build_parser, field_docs
from trainer.settings import FIELD_OF_SETTING

PAGE = Path(__file__).resolve().parents[1] / "docs" / "trainer.md"
"""The trainer guide whose table this writes."""
BEGIN = "<!-- trainer flags: generated from TrainConfig by `python -m trainer.docs --write`; do not edit -->"
END = "<!-- end of the trainer flags -->"
REGENERATE = "python -m trainer.docs --write"
"""The command that brings the page's table back to the code."""
HEADER = ("| flag | value | default | ultralytics | meaning |", "|---|---|---|---|---|")


def _cell(text: str) -> str:
    """A table cell: a `|` inside it would end it."""
    return text.replace("|", "\\|")


def _type_name(hint: Any) -> str:
    """A field's type as the table says it: `int`, `float`, `bool`, `str`, `int or list`."""
    kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    if any(typing.get_origin(k) is tuple for k in kinds):
        return "int or list"
    return " or ".join(getattr(k, "__name__", str(k)) for k in kinds)


def _value(action: argparse.Action, hint: Any) -> str:
    """What the flag takes: its choices, its type, and what a bare flag means."""
    text = " | ".join(f"`{c}`" for c in action.choices) if action.choices else _type_name(hint)
    if action.nargs == "?":
        bare = _default(action.const) if action.const != "" else "the run directory's last.pt"
        text += f", bare: {bare}"
    return text


def _default(value: Any) -> str:
    if value in (None, "", (), MISSING):
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _usage(action: argparse.Action) -> str:
    """`--amp [MODE]`, `--epochs EPOCHS`, `--check`: the flag as argparse's usage writes it."""
    flag = action.option_strings[0]
    if action.nargs == 0:
        return flag
    metavar = action.metavar or action.dest.upper()
    return f"{flag} [{metavar}]" if action.nargs == "?" else f"{flag} {metavar}"


def rows() -> list[str]:
    """A table row per flag of the trainer's parser, in its order."""
    parser = build_parser()
    hints = typing.get_type_hints(TrainConfig)
    defaults = {f.name: f.default for f in fields(TrainConfig)}
    setting_of = {name: key for key, name in FIELD_OF_SETTING.items() if key not in ("mode", "task")}
    setting_of["weights"] = "model=*.pt, pretrained=*.pt"
    setting_of["model"] = "model=*.yaml"
    setting_of["val_period"] = "val=False"  # validate only after the last epoch
    aliases: dict[str, list[str]] = {}
    for alias, (name, _text) in ALIASES.items():
        aliases.setdefault(name, []).append(alias)
    out = []
    for action in parser._actions:
        if not action.option_strings or action.dest == "help" or action.dest in FLAG_FIELD:
            continue  # the positional KEY=VALUE settings, --help, and the second spellings
        name = action.dest
        flags = ", ".join(f"`{s}`" for s in [_usage(action), *aliases.get(name, [])])
        if name in hints:
            value, default, doc = _value(action, hints[name]), _default(defaults[name]), field_docs()[name]
        else:  # --cfg, --check: flags that are not a setting
            value = "repeatable" if action.default == [] else ("switch" if action.nargs == 0 else "")
            default, doc = "—", str(action.help)
        setting = setting_of.get(name, "")
        setting = ", ".join(f"`{s if '=' in s else s + '='}`" for s in setting.split(", ")) if setting else "—"
        out.append("| " + " | ".join(_cell(c) for c in (flags, value, default, setting, doc)) + " |")
    return out


def flag_table() -> str:
    """The whole table, as it stands between the markers."""
    return "\n".join((*HEADER, *rows())) + "\n"


def with_table(page: str) -> str:
    """The page with its table replaced by the code's.

    Raises:
        ValueError: the page lacks a marker, or has them out of order.
    """
    head, found, rest = page.partition(BEGIN + "\n")
    _old, found_end, tail = rest.partition(END)
    if not found or not found_end:
        raise ValueError(f"the two marker lines are missing; put them where the table goes:\n{BEGIN}\n{END}")
    return head + BEGIN + "\n" + flag_table() + END + tail


def table_of(page: str) -> str:
    """What stands between the page's markers ('' when they are missing)."""
    _head, found, rest = page.partition(BEGIN + "\n")
    table, found_end, _tail = rest.partition(END)
    return table if found and found_end else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.docs", description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite the table in {PAGE.name} in place")
    args = parser.parse_args(argv)
    if not args.write:
        sys.stdout.write(flag_table())
        return 0
    try:
        PAGE.write_text(with_table(PAGE.read_text()))
    except ValueError as e:
        print(f"{PAGE}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
