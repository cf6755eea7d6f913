"""Where steps are recorded: only in sim/engine/step.py and sim/engine/fast_forward_run.py, each
from local variables named as StepRecord's fields, in their order, so a reordered or renamed
field cannot slip through a positional tuple unnoticed (sim.engine.step_log stores the fields,
and makes a StepRecord only from what it stored)."""

from __future__ import annotations

import ast
from pathlib import Path

from sim.engine.step_log import StepRecord

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("sim", "executor", "servelab")


def _record_calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == "StepRecord"]


def _packs(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == "pack"]


RECORDERS = (ROOT / "sim" / "engine" / "step.py", ROOT / "sim" / "engine" / "fast_forward_run.py")


def test_every_step_record_is_built_from_locals_named_as_its_fields():
    calls = [call for path in RECORDERS for call in _packs(ast.parse(path.read_text()))]
    # Engine.finish_step; FastForwardRun._apply_steps and _apply_together
    assert len(calls) == 3
    for call in calls:
        names = tuple(element.id if isinstance(element, ast.Name) else ast.unparse(element)
                      for element in call.args)
        assert names == StepRecord._fields, f"line {call.lineno}"


def test_no_other_module_builds_a_step_record():
    builders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path in RECORDERS:
                continue
            if _record_calls(ast.parse(path.read_text())):
                builders.append(str(path.relative_to(ROOT)))
    assert builders == []
