"""The planner's scale search: the same smallest scales however it steps to them; each
family's engine limits, vLLM's for its GPU unless given."""

from __future__ import annotations

import pytest

from servelab.sweeps.deployment_search import Family, SearchContext, smallest_scales
from servelab.sweeps.grid import CapacitySlo
from sim.specs.engine_limits import vllm_server_limits
from sim.specs.hardware import hardware_spec
from sim.specs.model_config import resolve_model
from workloads import open_trace

SPAN_S = 100.0
NEEDED = {"a100-80gb": 13, "h100": 6, "h200": 5}  # smallest scale that holds, per GPU


def _runner(seen: list, needed: dict[str, int] = NEEDED):
    """A deployment holds from its GPU's needed scale up; one short of it runs longer
    before it certainly fails the nearer it is to holding."""

    def runner(points):
        rows = []
        for point in points:
            need = needed[point.family.hardware]
            held = point.scale >= need
            seen.append((point.family.hardware, point.scale, held))
            rows.append({"meets_slo": held, "hardware": point.family.hardware,
                         "deployment": point.family.label(),
                         "usd_per_hour": float(point.scale), "scale": point.scale,
                         "stopped_s": None if held else SPAN_S * (point.scale / need) ** 2})
        return rows

    return runner


def test_growing_by_how_long_failures_ran_finds_the_same_scales_with_fewer_held_runs():
    families = [Family(hardware) for hardware in NEEDED]
    doubled, grown = [], []
    plain = smallest_scales(_runner(doubled), families, CapacitySlo(), max_engines=64)
    short = smallest_scales(_runner(grown), families, CapacitySlo(), max_engines=64,
                            span_s=SPAN_S)
    assert [r["scale"] for r in plain.met] == [r["scale"] for r in short.met] == \
        list(NEEDED.values())
    held = [(hw, scale) for hw, scale, ok in grown if ok]
    # Held runs go to the end of the trace: fewer of them, none past twice what is needed.
    assert len(held) < sum(ok for *_, ok in doubled)
    assert all(scale < 2 * NEEDED[hw] for hw, scale in held)


def test_growth_never_probes_past_where_doubling_stops():
    seen: list = []
    # 40 is past 32, the last scale doubling from 1 reaches under 63 engines.
    search = smallest_scales(_runner(seen, {"h100": 40}), [Family("h100")], CapacitySlo(),
                             max_engines=63, span_s=SPAN_S)
    assert search.met == [] and max(scale for _, scale, _ in seen) == 32


class _NewestFirst:
    """Probes in flight side by side, the newest finishing first (a faster worker)."""

    slots = 3

    def __init__(self, runner) -> None:
        self.runner, self.rows = runner, {}

    def submit(self, point) -> object:
        handle = object()
        self.rows[handle] = self.runner([point])[0]
        return handle

    def wait(self, handles) -> list:
        return [(handles[-1], self.rows.pop(handles[-1]))]


def test_unsearched_families_are_listed_in_the_given_order_however_probes_finish():
    families = [Family(hardware, tp) for tp in (1, 2, 4) for hardware in NEEDED]
    price = {"a100-80gb": 2.0, "h100": 3.0, "h200": 4.0}

    def usd(family: Family, scale: int) -> float:
        return scale * family.tp * price[family.hardware]

    searches = [smallest_scales(stream, families, CapacitySlo(), max_engines=64, price=usd,
                                top=1, batch=3)
                for stream in (_runner([]), _NewestFirst(_runner([])))]
    pruned = [[family for family, _ in search.pruned] for search in searches]
    assert len(pruned[0]) >= 4
    assert pruned[0] == pruned[1] == sorted(pruned[0], key=families.index)


def _context() -> SearchContext:
    trace = open_trace("synthetic:n=20,rate=2,prompt=fixed(64),output=fixed(8)")
    return SearchContext(trace, CapacitySlo())


@pytest.mark.parametrize("hardware", ["h100", "l40s", "a100-80gb"])
def test_each_family_runs_vllms_limits_for_its_gpu_unless_given(hardware):
    context = _context()
    spec = hardware_spec(hardware)
    vllm = vllm_server_limits(spec.name, spec.memory_bytes,
                              resolve_model(context.model).max_position_embeddings)
    for tp in (1, 2):  # per engine, whatever its parallelism
        config = context.scheduler_config(Family(hardware, tp))
        assert (config.max_num_seqs, config.budget, config.max_model_len) == \
            (vllm.max_num_seqs, vllm.token_budget, vllm.max_model_len)
    given = context.scheduler_config(Family(hardware, max_num_seqs=128, token_budget=4096))
    assert (given.max_num_seqs, given.budget) == (128, 4096)


def test_the_kv_pool_is_sized_for_the_limits_the_family_runs():
    # vLLM's memory profile runs one step of the budget: H100's 8,192 tokens hold back more
    # memory than 2,048 do, so fewer KV blocks remain.
    context = _context()
    vllm = context.resolved(Family("h100")).kv_pool.num_blocks
    small = context.resolved(Family("h100", max_num_seqs=256, token_budget=2048))
    assert vllm < small.kv_pool.num_blocks
