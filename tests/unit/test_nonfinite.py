"""Numbers that are not numbers: `.nan`/`.inf` are refused wherever the user gives a number (the
inventory's number types, once in the schema; the command line's options), node readings that are
not finite count as missing, and every JSON orch prints is strict JSON."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path
from typing import Union, get_args, get_origin

import pytest

from orchestrator.config import inventory, schema
from orchestrator.errors import InventoryError


def _number_keys(model: type, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key of the schema whose type admits a float or an int (`nodes`: its first item's)."""
    out: list[tuple[str, ...]] = []
    for key, tp in schema.fields_of(model).items():
        if get_origin(tp) is list:
            tp = get_args(tp)[0]
        members = get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)
        for member in members:
            if isinstance(member, type) and issubclass(member, schema._Schema):
                out.extend(_number_keys(member, (*prefix, key)))
            elif member in (float, int):
                out.append((*prefix, key))
                break
    return out


ALL_KEYS = [k for k in _number_keys(schema.InventoryModel) if k[0] != "spare"]


def _yaml(keys: tuple[str, ...], value: str) -> str:
    """An inventory of one node with `keys` set to `value`, on the file's last line."""
    if keys[0] == "nodes":
        nested = ["nodes:", "  - host: a"] + ["    " + "  " * d + f"{k}:" for d, k in enumerate(keys[1:])]
    else:
        nested = ["nodes:", "  - host: a"] + ["  " * d + f"{k}:" for d, k in enumerate(keys)]
    nested[-1] += f" {value}"
    return "\n".join(nested) + "\n"


def test_the_schema_has_the_number_keys_the_issue_names() -> None:
    dotted = {".".join(k) for k in ALL_KEYS}
    assert {
        "job.telemetry_s",
        "job.stop_grace_s",
        "job.stall_timeout_s",
        "checks.fabric.share",
        "nodes.connect_timeout",
        "nodes.ssh.port",
        "master.port",
    } <= dotted


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", ".NaN", "1.0e+999", "1e999"])
@pytest.mark.parametrize("keys", ALL_KEYS, ids=[".".join(k) for k in ALL_KEYS])
def test_a_non_finite_number_is_refused_with_file_line_and_key(
    tmp_path: Path, keys: tuple[str, ...], value: str
) -> None:
    path = tmp_path / "inv.yaml"
    text = _yaml(keys, value)
    path.write_text(text)
    with pytest.raises(InventoryError) as info:
        inventory.load(path)
    assert info.value.exit_code == 2
    message = str(info.value)
    line = len(text.splitlines())
    assert f"{path}:{line}:" in message, message
    assert keys[-1] in message, message
    assert "a finite number" in message or value == "1e999", message  # a string to YAML


@pytest.mark.parametrize(
    "where",
    [
        "env:\n  X: .nan\n",
        "job:\n  args:\n    lr0: .inf\n",
        "job:\n  args: [--lr0, .nan]\n",
        "job:\n  args:\n    x: [1, .nan]\n",
    ],
)
def test_a_non_finite_number_among_free_values_is_refused(tmp_path: Path, where: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("nodes:\n  - host: a\n" + where)
    with pytest.raises(InventoryError) as info:
        inventory.load(path)
    assert "a finite number" in str(info.value), str(info.value)


def test_finite_numbers_still_load(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("nodes:\n  - host: a\njob:\n  telemetry_s: 2.5\n  stop_grace_s: 3\n  args:\n    lr0: 0.01\n")
    inv = inventory.load(path)
    assert inv.job.telemetry_s == 2.5 and inv.job.stop_grace_s == 3.0
    assert math.isfinite(inv.job.telemetry_s)


def test_a_size_too_large_for_a_float_is_refused() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        inventory.parse_size("9" * 400 + "G")


def _number_options() -> list[tuple[str, str]]:
    """(command, option) for every option of every orch command that takes a float."""
    import click

    from orchestrator.cli.commands import cli

    out = []
    for name, command in sorted(cli.commands.items()):
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(
                param.type, (click.types.FloatParamType, click.FloatRange)
            ):
                out.append((name, max(param.opts, key=len)))
    return out


NUMBER_OPTIONS = _number_options()


def test_the_commands_have_the_number_options_the_issue_names() -> None:
    assert {("up", "--stall-timeout"), ("exec", "--timeout")} <= set(NUMBER_OPTIONS)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "1e999"])
@pytest.mark.parametrize(("command", "option"), NUMBER_OPTIONS, ids=[f"{c}{o}" for c, o in NUMBER_OPTIONS])
def test_a_non_finite_option_value_is_refused_with_exit_2(
    command: str, option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    with pytest.raises(SystemExit) as info:
        main([command, f"{option}={value}", "--", "true"] if command == "exec" else [command, f"{option}={value}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert option in err and "a finite number" in err, err


def _strict(text: str) -> object:
    """JSON as RFC 8259 reads it: NaN, Infinity and -Infinity are not JSON."""

    def refuse(name: str) -> object:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


NOT_NUMBERS = "0, GPU-x, NVIDIA V100, nan, 1e999, 16384, inf, -inf, NaN, 0x0000000000000000, nan"


def test_nvidia_smi_readings_that_are_not_finite_are_missing() -> None:
    from orchestrator.node import telemetry

    gpu = telemetry.parse_gpu_csv(NOT_NUMBERS)[0]
    assert gpu["index"] == 0 and gpu["mem_total_mb"] == 16384
    for key in ("util_pct", "mem_used_mb", "temp_c", "power_w", "sm_mhz", "fan_pct"):
        assert gpu[key] is None, (key, gpu)
    # an index that is not a number does not end the sampler
    assert telemetry.parse_gpu_csv("nan, GPU-x, V100, 1, 2, 3, 4, 5, 6, 0x0, 7")[0]["index"] is None


def test_the_agents_telemetry_line_is_strict_json_whatever_it_read() -> None:
    from orchestrator.node import telemetry

    line = telemetry.line(
        {"v": 1, "gpus": [{"index": 0, "temp_c": math.inf, "util_pct": math.nan}], "cpu_pct": -math.inf, "load1": 1.5}
    )
    data = _strict(line[len(telemetry.PREFIX) :])
    assert data == {"v": 1, "gpus": [{"index": 0, "temp_c": None, "util_pct": None}], "cpu_pct": None, "load1": 1.5}


def test_orch_top_reads_a_non_finite_reading_as_missing_and_prints_strict_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An agent of before (or anything else) wrote NaN/Infinity into a telemetry line: no "hot
    (inf °C)", and `orch top --json` is JSON."""
    from orchestrator.cli import render
    from orchestrator.logs.lines import format_ts
    from orchestrator.top import TopView
    from tests.telemetry_support import make_top_run

    ts0 = 1_796_000_000.0
    run = make_top_run(tmp_path, ["v100x8"], ts0=ts0)
    log = run.path / "nodes" / "n1.log"
    text = (
        'telemetry {"v":1,"gpus":[{"index":0,"uuid":"GPU-0","name":"V100","util_pct":NaN,"temp_c":Infinity,'
        '"power_w":-Infinity,"mem_used_mb":1,"mem_total_mb":2}],"gpu_error":null,"cpu_pct":NaN,"load1":Infinity,'
        '"ncpu":16,"mem_used_mb":1,"mem_total_mb":2,"ranks":[{"rank":0,"local_rank":0,"pid":1,"cpu_pct":NaN}]}'
    )
    log.write_text(log.read_text() + f"{format_ts(ts0 + 300)} orch {text}\n")
    view = TopView(run, run.inventory(), clock=lambda: ts0 + 301)
    view.read_copies()
    report = view.report()
    render.json_out(report.to_json())
    data = _strict(capsys.readouterr().out)
    gpu = data["nodes"][0]["gpus"][0]  # type: ignore[index]
    assert gpu["temp_c"] is None and gpu["util_pct"] is None and gpu["power_w"] is None
    assert "hot" not in gpu["flags"] and "hot" not in data["nodes"][0]["flags"]  # type: ignore[index]


def test_json_out_never_prints_nan(capsys: pytest.CaptureFixture[str]) -> None:
    """The one door of every `--json`: a value that is not finite is null there, never `NaN`."""
    from orchestrator.cli import render

    render.json_out({"a": math.nan, "b": [math.inf, 1.5], "c": {"d": -math.inf}})
    assert _strict(capsys.readouterr().out) == {"a": None, "b": [None, 1.5], "c": {"d": None}}
