"""The test tiers stay what docs/DEVELOPMENT.md says they are: tests/unit pure (no
cluster, torchrun, browser, daemon or model build), tests/gpu collected everywhere and marked gpu,
and the Makefile's targets selecting tiers by directory, never by a marker that could leave a
selection empty (pytest exits 5 when nothing is collected)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
MAKEFILE = (TESTS.parent / "Makefile").read_text()
CLUSTER_FIXTURES = {"cluster", "netns_cluster", "make_cluster", "cluster_in", "trainer_reference"}
IMPURE = ('"chromium"', "TestCluster(", "make_cluster(", "run_trainer", "run_nodes", "tests.up_helpers")
"""What a tests/unit module must not contain: a browser, a cluster of its own, the trainer's launch
helpers, `orch up`'s (a node agent started, torchrun)."""


def functions_in(path: Path) -> list[ast.FunctionDef]:
    return [
        n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    ]


def test_the_unit_tier_starts_no_cluster_launcher_browser_or_agent() -> None:
    modules = sorted((TESTS / "unit").glob("test_*.py"))
    assert len(modules) > 20
    for path in modules:
        if path.name == Path(__file__).name:
            continue
        text = path.read_text()
        found = [word for word in IMPURE if word in text]
        assert not found, f"{path.name} uses {found}: it belongs in tests/local or tests/integration"
        for fn in functions_in(path):
            args = {a.arg for a in fn.args.args}
            assert not args & CLUSTER_FIXTURES, f"{path.name}::{fn.name} uses {args & CLUSTER_FIXTURES}"


def test_the_gpu_tier_is_collected_everywhere_and_every_test_is_marked_gpu() -> None:
    modules = sorted((TESTS / "gpu").glob("test_*.py"))
    assert modules
    for path in modules:
        tree = ast.parse(path.read_text())
        marks = [
            n
            for n in tree.body
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
        ]
        assert marks and "pytest.mark.gpu" in ast.unparse(marks[0].value), f"{path.name}: no module-wide gpu mark"
        # skipped, never deselected, where there is no GPU: `pytest -m gpu tests/gpu` always collects
        assert "skipif(not torch.cuda.is_available()" in ast.unparse(marks[0].value)
        assert functions_in(path), f"{path.name} has no test"


def target(name: str) -> str:
    m = re.search(rf"^{re.escape(name)}:.*\n((?:\t.*\n)+)", MAKEFILE, re.M)
    assert m, f"no `{name}` target in the Makefile"
    return m.group(1)


def test_the_makefile_selects_tiers_by_directory() -> None:
    def marker_selected(recipe: str) -> bool:
        return re.search(r"pytest\b.*\s-m\s", recipe) is not None

    assert "pytest tests/unit" in target("test-fast") and not marker_selected(target("test-fast"))
    assert "pytest -m gpu tests/gpu" in target("test-gpu")
    whole = target("test")
    assert "pytest -n" in whole and not marker_selected(whole) and "tests/" not in whole  # every tier
    assert "ORCH_TEST_STRICT=" in whole
    assert re.search(r"^test: deps ", MAKEFILE, re.M), "make test checks the system packages first"
