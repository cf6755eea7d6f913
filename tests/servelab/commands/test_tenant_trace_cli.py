"""`servelab trace` on a trace with tenants and priorities: a line per tenant and per class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.cli import main


def test_cli_prints_a_line_per_tenant_and_priority(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    spec = (
        "synthetic:tenant=flood,n=400,rate=20,priority=1;tenant=light,n=40,rate=2,prompt=fixed(256)"
    )
    path = tmp_path / "stats.json"
    assert main(["trace", spec, "--seed", "2", "--json", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    tenant_header = out.index(next(line for line in out if line.startswith("tenant ")))
    flood, light = out[tenant_header + 1].split(), out[tenant_header + 2].split()
    assert flood[:2] == ["flood", "400"] and light[:2] == ["light", "40"]
    assert light[3:] == ["256.0", "128.0"]  # prompt and output means (output's default)
    priority_header = out.index(next(line for line in out if line.startswith("priority ")))
    assert [line.split()[:2] for line in out[priority_header + 1 :]] == [["0", "40"], ["1", "400"]]
    stats = json.loads(path.read_text())["trace"]
    assert [(t["group"], t["requests"]) for t in stats["tenants"]] == [
        ("flood", 400),
        ("light", 40),
    ]
    assert [(p["group"], p["requests"]) for p in stats["priorities"]] == [(0, 40), (1, 400)]
    assert stats["tenants"][0]["rate_per_s"] == pytest.approx(20, rel=0.2)


def test_cli_without_tenants_prints_no_group_lines(capsys: pytest.CaptureFixture) -> None:
    assert main(["trace", "synthetic:n=20,rate=2"]) == 0
    out = capsys.readouterr().out
    assert "tenant " not in out and "priority " not in out
