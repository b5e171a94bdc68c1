"""The GPU tier (tests/gpu) runs only on a GPU machine, which is rare: between two runs it must not
drift from the code. Every GPU test module is imported here, and every call it makes to this
repository's code (trainer, orchestrator, tests, bench) is held to the callee's current signature,
by the same names the module resolves: the function exists, the arguments bind, and a tuple the
test unpacks has the length the callee's annotation says it returns."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
OURS = ("trainer", "orchestrator", "tests", "bench")
GPU_MODULES = sorted((TESTS / "gpu").glob("test_*.py"))


def ours(obj: Any) -> bool:
    """A function, class or module defined in this repository."""
    module = obj if isinstance(obj, ModuleType) else inspect.getmodule(obj)
    return module is not None and module.__name__.split(".")[0] in OURS


def resolve_import(node: ast.ImportFrom | ast.Import) -> Iterator[tuple[str, Any]]:
    """The names an import statement binds, to what they are (only this repository's)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] in OURS:
                yield (
                    (alias.asname or alias.name.split(".")[0]),
                    importlib.import_module(alias.name if alias.asname else alias.name.split(".")[0]),
                )
        return
    if not node.module or node.module.split(".")[0] not in OURS or node.level:
        return
    base = importlib.import_module(node.module)
    for alias in node.names:
        try:
            value = getattr(base, alias.name)
        except AttributeError:
            value = importlib.import_module(f"{node.module}.{alias.name}")  # a submodule not yet imported
        yield alias.asname or alias.name, value


def returned_tuple_length(fn: Any) -> int | None:
    """How many values ``fn`` returns by its annotation (``tuple[a, b, c]``), None when not a
    fixed tuple."""
    annotation = inspect.signature(fn).return_annotation
    if not isinstance(annotation, str):
        annotation = getattr(annotation, "__name__", None) if annotation is inspect.Signature.empty else str(annotation)
    if not annotation:
        return None
    expr = ast.parse(annotation, mode="eval").body
    if isinstance(expr, ast.Subscript) and ast.unparse(expr.value).lower() in ("tuple", "typing.tuple"):
        elts = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
        if not any(isinstance(e, ast.Constant) and e.value is Ellipsis for e in elts):
            return len(elts)
    return None


def drift(source: str, module: ModuleType) -> list[str]:
    """What in ``source`` (the text of ``module``) calls this repository's code in a way its
    current signatures do not allow."""
    tree = ast.parse(source)
    names: dict[str, Any] = {k: v for k, v in vars(module).items() if ours(v)}
    problems = []
    for node in ast.walk(tree):  # the imports made inside test functions too
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            try:
                names.update(resolve_import(node))
            except (ImportError, AttributeError) as e:
                problems.append(f"line {node.lineno}: {ast.unparse(node)}: {e}")

    def target(call: ast.Call) -> tuple[str, Any] | None:
        f = call.func
        if isinstance(f, ast.Name) and f.id in names:
            return f.id, names[f.id]
        if (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name)
            and isinstance(names.get(f.value.id), ModuleType)
        ):
            base = names[f.value.id]
            spelled = f"{f.value.id}.{f.attr}"
            if not hasattr(base, f.attr):
                problems.append(f"line {call.lineno}: {spelled}: {base.__name__} has no {f.attr}")
                return None
            return spelled, getattr(base, f.attr)
        return None

    checked: dict[int, Any] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        found = target(node)
        if found is None or not callable(found[1]) or isinstance(found[1], ModuleType) or not ours(found[1]):
            continue
        spelled, fn = found
        checked[id(node)] = fn
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue
        try:
            inspect.signature(fn).bind(*[None] * len(node.args), **{k.arg: None for k in node.keywords if k.arg})
        except TypeError as e:
            problems.append(f"line {node.lineno}: {spelled}(...): {e}")
        except ValueError:  # no signature to read (a builtin)
            pass
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and id(node.value) in checked:
            for t in node.targets:
                if isinstance(t, ast.Tuple) and not any(isinstance(e, ast.Starred) for e in t.elts):
                    n = returned_tuple_length(checked[id(node.value)])
                    if n is not None and n != len(t.elts):
                        problems.append(
                            f"line {node.lineno}: unpacks {len(t.elts)} values from "
                            f"{ast.unparse(node.value.func)}, which returns {n}"
                        )
    return problems


def load(path: Path) -> ModuleType:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(f"tests.gpu.{path.stem}")


@pytest.mark.parametrize("path", GPU_MODULES, ids=[p.name for p in GPU_MODULES])
def test_every_gpu_test_module_imports_and_calls_the_current_code(path: Path) -> None:
    module = load(path)
    assert drift(path.read_text(), module) == []


def test_the_check_sees_a_stale_call() -> None:
    """What made the GPU tier fail on its first GPU run: two values unpacked from train_epoch,
    which returns three; a function that is gone; a keyword that is gone."""
    module = load(GPU_MODULES[0])
    stale = (
        "from trainer import loop\n"
        "from trainer.loop import resolve_amp\n"
        "means, throughput = loop.train_epoch(0, None, None, None, None)\n"
        "loop.amp_warning('bf16', None)\n"
        "resolve_amp('bf16', None, gpu=(7, 0))\n"
        "a, b, c = loop.train_epoch(0, None, None, None, None)\n"
    )
    found = drift(stale, module)
    assert len(found) == 3, found
    assert "line 3: unpacks 2 values from loop.train_epoch, which returns 3" in found
    assert any(p.startswith("line 4: loop.amp_warning: trainer.loop has no amp_warning") for p in found)
    assert any(p.startswith("line 5: resolve_amp(...): ") and "gpu" in p for p in found)
