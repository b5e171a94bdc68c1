"""The container runtimes are one table (config/runtimes.py): no other module of orch names a
runtime or branches on one (read from the source, like tests/unit/test_layers.py), each entry is a
whole capability set, and the list of runtimes is the table's everywhere it is shown."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from orchestrator.config import runtimes
from orchestrator.config.runtimes import RUN_PARTS, RUNTIMES, TABLE

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
HOME = "config/runtimes.py"
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if str(p.relative_to(PACKAGE)) != HOME)


def _rel(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


def runtime_names(source: str, names: tuple[str, ...] = RUNTIMES) -> list[str]:
    """Where a module writes a runtime's name as a value of its own: a string (or an f-string's
    piece) that is exactly a runtime's name: `c.runtime == "apptainer"`, `("docker", "podman")`,
    a `click.Choice` spelled out. Prose that mentions one (a docstring, a message) is not a name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append(f"{node.value!r} at line {node.lineno}")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_no_module_names_a_runtime_outside_the_table(path: Path) -> None:
    """What a runtime can do is asked of its entry (`runtimes.runtime(name)`), never decided by
    its name: a new runtime is an entry, not a branch in every module that runs one."""
    assert runtime_names(path.read_text()) == [], f"{_rel(path)} names a runtime: ask config/runtimes.py"


def test_the_guard_sees_a_branch_on_a_runtime_name() -> None:
    assert runtime_names('if c.runtime == "apptainer":\n    pass\n') == ["'apptainer' at line 1"]
    assert runtime_names('RUNTIMES = ("docker", "podman", "apptainer")') != []
    assert runtime_names("click.Choice(['docker', 'podman'])") != []
    assert runtime_names('tool = f"{x}" if runtime != "podman" else "docker"') != []
    assert runtime_names('"""docker and podman keep containers."""\nhint = f"install {rt.name} here"') == []
    assert runtime_names((PACKAGE / HOME).read_text()) != []  # the table itself names them


def test_the_table_is_the_runtime_list_shown_everywhere() -> None:
    from orchestrator.cli.commands import cli

    push = cli.commands["image"].commands["push"]  # type: ignore[attr-defined]
    choices = next(p.type.choices for p in push.params if p.name == "runtime")
    assert tuple(choices) == RUNTIMES == ("docker", "podman", "apptainer")


@pytest.mark.parametrize("rt", TABLE.values(), ids=lambda r: r.name)
def test_each_entry_is_a_whole_capability_set(rt: runtimes.Runtime) -> None:
    assert rt.run[0] == rt.name and set(rt.parts) <= set(RUN_PARTS) and rt.inspect and rt.no_such_image
    assert [p for p in RUN_PARTS if p in rt.parts] == list(rt.parts)  # in the one order
    # what keeps containers names, lists, removes and enters them; what keeps none does none of it
    assert bool(rt.keeps_containers) == bool(rt.rm) == bool(rt.ps) == bool(rt.exec) == ("name" in rt.parts)
    for argv in (rt.ps, rt.exec):  # the program and its one word (orch exec's node script takes them so)
        assert not argv or (len(argv) == 2 and argv[0] == rt.name)
    # an image is either exported and loaded, or a file copied as it is; either way its GPUs are passed
    assert bool(rt.save) == bool(rt.load) != rt.image_file
    assert (rt.gpus_once or rt.gpus_each) and rt.gpu_flags([]) == [] and rt.gpu_env(None) == {}
    assert rt.keeps_containers == bool(rt.gpu_fix)
    # what keeps containers prints a label, is told not to pull, names its limits' and init's fixes
    assert (
        rt.keeps_containers == bool(rt.label_format) == bool(rt.pull_never) == bool(rt.limits_fix) == bool(rt.init_fix)
    )
    assert rt.pulls == bool(rt.pull_never)  # whatever can pull can be told not to
    # its grammar: one-letter flags name long ones, and its own workdir and mount flags are among them
    assert all(len(k) == 1 and v.startswith("--") for k, v in rt.grammar.short.items())
    assert all(b.startswith("--") for b in rt.grammar.booleans)
    for own in (rt.workdir, rt.mount):
        assert own.startswith("--") or own[1:] in rt.grammar.short, own


def test_each_runtime_gives_its_gpus_its_own_way() -> None:
    two = ["GPU-a", "GPU-b"]
    assert TABLE["docker"].gpu_flags(two) == ["--gpus", '"device=GPU-a,GPU-b"']
    assert TABLE["podman"].gpu_flags(two) == ["--device", "nvidia.com/gpu=GPU-a", "--device", "nvidia.com/gpu=GPU-b"]
    assert TABLE["apptainer"].gpu_flags(two) == ["--nv"]
    assert TABLE["apptainer"].gpu_env(two) == {"APPTAINERENV_CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}


ID = "d9ff8d5725a6979dcf9fb3905a3d811e3881439e340b86201673e39e55efeba6"
"""An image ID as docker and podman print it (docker after `sha256:`), and a .sif's sha256."""
NOT_IDS = (ID[:12], ID.upper(), ID + "0", "\x1b]0;owned\x07\x1b[2J" + ID[20:], "\u202e" + ID[1:], "sha256:" + ID, "")
"""A short ID, upper case, too long, terminal escapes in front, the `sha256:` prefix, nothing."""


@pytest.mark.parametrize(
    ("name", "rc", "out", "err", "want"),
    [
        ("docker", 0, f'sha256:{ID}\t["CUDA_VERSION=12.1.0"]\n', "", (ID, {"CUDA_VERSION": "12.1.0"}, None)),
        ("podman", 0, f"{ID}\tnull\n", "", (ID, {}, None)),
        ("podman", 125, "", "Error: yoloe:latest: image not known\n", (None, {}, None)),
        ("docker", 1, "", "Error: No such image: y\n", (None, {}, None)),
        ("docker", 1, "", "Cannot connect to the Docker daemon\n", (None, {}, "Cannot connect to the Docker daemon")),
        ("docker", None, "", "docker: not found in PATH", (None, {}, "docker: not found in PATH")),
        ("apptainer", 0, f"{ID}  /i/y.sif\n", "", (ID, {}, None)),
        ("apptainer", 1, "", "sha256sum: /i/y.sif: No such file or directory\n", (None, {}, None)),
    ],
)
def test_which_image_a_machine_holds_is_read_once_for_every_runtime(
    name: str, rc: int | None, out: str, err: str, want: tuple[object, ...]
) -> None:
    got = runtimes.held(TABLE[name], rc, out, err)
    assert (got.image_id, dict(got.env), got.error) == want


@pytest.mark.parametrize("rt", TABLE.values(), ids=lambda r: r.name)
def test_an_answer_that_is_no_image_id_is_refused_as_the_runtimes_answer(rt: runtimes.Runtime) -> None:
    """The ID is the launch's image word (`Pins.image_id`) and a line of `orch image push`: what a
    node prints in its place (a login script's banner, a wrapper's words, terminal escapes) is an
    error naming what was printed and the fix, never an ID."""
    assert rt.is_image_id(ID) and not any(rt.is_image_id(x) for x in NOT_IDS)
    for bad in (*NOT_IDS[:5], "Welcome to gpu03, a shared node"):
        got = runtimes.held(rt, 0, f"{bad}\t[]\n", "")
        assert got.image_id is None and got.error is not None and got.fix is not None, (rt.name, bad)
        assert got.error.startswith(f"{rt.program} answered ") and got.error.endswith(f"not {rt.id_what}"), got.error
        assert bad.split()[0][:16] in got.error  # the node's own words, for the renderer to escape
