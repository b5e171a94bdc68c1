"""`orch exec --container RUN`: the node program's arguments (golden: every value an argument, the
node's own labels among them), and the usage it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config.container import NO_CONTAINER_EXIT, Container
from orchestrator.config.inventory import parse
from orchestrator.config.jobenv import EXEC_GRACE_S, box_exec
from orchestrator.node import execbox
from orchestrator.remote.exec import box_line

FILTERS = ["label=orch.run=r1", "label=orch.node=n1", "label=orch.nonce=0123456789ab"]


def test_the_node_programs_arguments_golden() -> None:
    box = box_exec(Container("podman", "img", python="/py"), "r1", "0123456789ab")
    assert box is not None
    head = ["podman", "ps", "exec", "r1"]
    assert box.args("n1", ["nvidia-smi", "-L"], None) == [*head, "0", "/py", "5", *FILTERS, "--", "nvidia-smi", "-L"]
    assert box.args("n1", ["echo $X | wc"], 2.5) == [
        *head,
        "2.5",
        "/py",
        "5",
        *FILTERS,
        "--",
        "sh",
        "-c",
        "echo $X | wc",
    ]
    assert box_exec(Container("apptainer", "/i.sif"), "r1", "0123456789ab") is None  # nothing to enter


def test_each_node_looks_for_its_own_container() -> None:
    """Issue 53 item 7: nodes sharing a runtime (`transport: local`, two nodes on one host) each
    find their own container, by the node's label; the line a node runs names it."""
    box = box_exec(Container("docker", "img"), "r1", "0123456789ab")
    assert box is not None
    a, b = (box.args(n, ["true"], None) for n in ("n1", "n2"))
    assert "label=orch.node=n1" in a and "label=orch.node=n2" in b
    node = parse("nodes:\n  - host: h\n    name: n2\n", "t.yaml").nodes[0]
    line = box_line(box, node, ["true"], None, tethered=False)
    assert "label=orch.node=n2" in line and line.startswith("exec ")


def test_the_node_program_and_the_controller_agree() -> None:
    assert execbox.NO_CONTAINER == NO_CONTAINER_EXIT
    box = box_exec(Container("podman", "i"), "r", "n")
    assert box is not None and float(box.args("x", ["t"], None)[6]) == EXEC_GRACE_S


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--container", "r1", "inv.yaml", "--", "true"], "--container RUN with an INVENTORY or -w"),
        (["--container", "r1", "--env", "A=1", "--", "true"], "--env with --container"),
    ],
)
def test_exec_container_usage(
    args: list[str], says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as info:
        main(["exec", *args])
    assert info.value.code == 2
    assert says in capsys.readouterr().err
