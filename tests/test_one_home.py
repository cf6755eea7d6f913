"""One home per idea: the engine's default limits, the default policy, the GPU spec and the
KV sizing arithmetic are each defined once in the source tree, and everything else reads them.

A definition is what sets a default: a constant or field, a parameter default, a dict entry,
an argparse default, an `or` fallback. A call's keyword that picks a value on purpose (a
report comparing budgets, vLLM's CPU limits handed to its server) is a choice, not a default.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("workloads", "sim", "executor", "servelab", "benchmarks")
LIMITS_HOME = "sim/specs/engine_limits.py"

def _sources() -> dict[str, str]:
    out = {}
    for tree in TREES:
        for path in (ROOT / tree).rglob("*.py"):
            out[path.relative_to(ROOT).as_posix()] = path.read_text()
    return out


def _is(node: ast.AST | None, value: int | str) -> bool:
    """A literal `value`, or its text (`default="256"` for a comma-separated flag)."""
    return isinstance(node, ast.Constant) and node.value in (value, str(value))


def _named(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else ""


def _settings(tree: ast.AST, value: int | str) -> list[tuple[int, str]]:
    """(line, name) of every default set to `value`: a constant or field, a parameter
    default, a dict entry, an argparse default (named by its flag), an `or` fallback."""
    return [(node.lineno, name) for node in ast.walk(tree)
            for name in _assigned(node, value) + _passed(node, value)]


def _assigned(node: ast.AST, value: int | str) -> list[str]:
    """Names a constant, a field or a parameter default sets to `value`."""
    if isinstance(node, ast.Assign) and _is(node.value, value):
        return [_named(target) for target in node.targets]
    if isinstance(node, ast.AnnAssign) and _is(node.value, value):
        return [_named(node.target)]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args.posonlyargs + node.args.args
        defaulted = args[len(args) - len(node.args.defaults):]
        pairs = [*zip(defaulted, node.args.defaults, strict=True),
                 *zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)]
        return [arg.arg for arg, default in pairs if _is(default, value)]
    return []


def _passed(node: ast.AST, value: int | str) -> list[str]:
    """Keys a dict maps to `value`, flags an argparse default gives it, `or` fallbacks."""
    if isinstance(node, ast.Dict):
        return [key.value for key, item in zip(node.keys, node.values, strict=True)
                if isinstance(key, ast.Constant) and _is(item, value)]
    if isinstance(node, ast.Call) and any(keyword.arg == "default" and _is(keyword.value, value)
                                          for keyword in node.keywords):
        return [" ".join(str(a.value) for a in node.args if isinstance(a, ast.Constant))]
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and _is(node.values[-1],
                                                                            value):
        return [ast.unparse(node)]
    return []


def _homes(value: int | str, names: str) -> list[str]:
    """`file:line name` of every default set to `value` on a name `names` matches."""
    pattern = re.compile(names, re.IGNORECASE)
    return [f"{rel}:{line} {name}" for rel, text in _sources().items()
            for line, name in _settings(ast.parse(text), value) if pattern.search(str(name))]


def _files(found: list[str]) -> list[str]:
    return [entry.split(":")[0] for entry in found]


def test_kv_block_size_is_set_once():
    assert _homes(16, r"block_size|block-size") == [f"{LIMITS_HOME}:13 block_size"]


def test_token_budget_and_max_num_batched_tokens_are_one_knob_set_once():
    found = _homes(2048, r"token.budget|max.num.batched.tokens|budget|profile_tokens")
    assert found == [f"{LIMITS_HOME}:19 token_budget"]


def test_running_requests_and_request_length_limits_are_set_once():
    assert _homes(256, r"max.num.seqs") == [f"{LIMITS_HOME}:14 max_num_seqs"]
    assert _homes(8192, r"max.model.len") == [f"{LIMITS_HOME}:15 max_model_len"]


def test_default_policy_is_set_once():
    found = _homes("continuous", r"policy|or ")
    assert found == ["sim/engine/scheduler_config.py:29 DEFAULT_POLICY"]


def test_one_dataclass_holds_a_gpus_numbers():
    """HardwareSpec is the one GPU type; the cost model reads it (GpuPeaks is a Protocol)."""
    holders = []
    for rel, text in _sources().items():
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ClassDef):
                continue
            fields = {item.target.id for item in node.body if isinstance(item, ast.AnnAssign)
                      and isinstance(item.target, ast.Name)}
            protocol = any(isinstance(base, ast.Name) and base.id == "Protocol"
                           for base in node.bases)
            if {"peak_flops", "mem_bandwidth_bytes_s"} <= fields and not protocol:
                holders.append(f"{rel}:{node.name}")
    assert holders == ["sim/specs/hardware.py:HardwareSpec"]


def test_kv_blocks_from_memory_are_counted_in_one_function():
    pattern = re.compile(r"\*\s*(?:2\s*\*\*\s*30|GiB)\)?\s*//")
    found = [f"{rel}:{n}" for rel, text in _sources().items()
             for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
    assert not found, found
