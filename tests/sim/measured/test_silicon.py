"""AIConfigurator's silicon rows: the row -> engine mapping, refusals, the statistics, and
a small row replayed end to end."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest

from sim.engine.core import FinishReason, Request
from sim.measured.silicon import (
    RowResult,
    error_stats,
    error_table,
    measured_means,
    refusals,
    row_deployment,
    row_model,
    run_closed_loop,
    simulate_row,
)
from sim.measured.silicon_rows import (
    COLUMNS,
    RowRefused,
    SiliconRow,
    extract,
    id_layout,
    id_layout_differs,
    load_rows,
    parse_row,
    replay_plan,
)

DENSE = SiliconRow("dense", "Qwen/Qwen3-32B", "0.12.0", "", "", "", 1024, 128, 8, 2, 1, 1, 1,
                   1, 150.0, 18.0)


def _moe(**changes) -> SiliconRow:
    row = SiliconRow("moe", "MiniMaxAI/MiniMax-M2.5", "0.18.0", "fp8", "fp8", "fp8", 8192,
                     1024, 8, 4, 1, 1, 1, 4, 900.0, 30.0)
    return replace(row, **changes)


def test_dense_row_runs_its_batch_as_users_on_its_tp_with_the_generator_limits():
    plan = replay_plan(DENSE)
    assert (plan.users, plan.warmup_requests, plan.measured_requests) == (8, 16, 160)
    assert (plan.tensor_parallel, plan.data_parallel, plan.expert_parallel) == (2, 1, False)
    assert plan.quantization is None
    assert plan.max_num_seqs == 512
    assert plan.max_num_batched_tokens == 512 + 1024 + 1500
    assert plan.max_model_len == 1024 + 128 + 1500


def test_moe_row_takes_the_unified_tp_from_its_expert_layout():
    plan = replay_plan(_moe(tp=4, moe_tp=1, moe_ep=4))
    assert (plan.tensor_parallel, plan.data_parallel, plan.expert_parallel) == (4, 1, True)
    assert plan.quantization == "fp8"
    # Attention DP 4 over 16 expert ranks: 4 ranks of TP 4, users over all ranks.
    plan = replay_plan(_moe(tp=4, attention_dp=4, moe_tp=1, moe_ep=16, batch_size=8))
    assert (plan.users, plan.tensor_parallel, plan.data_parallel) == (32, 4, 4)
    assert plan.expert_parallel
    # Experts split by TP only: TP from moe_tp, no expert parallel.
    plan = replay_plan(_moe(tp=1, moe_tp=8, moe_ep=1))
    assert (plan.tensor_parallel, plan.expert_parallel) == (8, False)


def test_an_id_naming_another_layout_replays_the_engine_it_names():
    # Columns: 4 DP ranks of 16 users over 16 expert ranks; the id: one TP 4 / EP 4 engine.
    row = _moe(row_id="2026_04_06_minimax_m2_5_h100_sxm_vllm_fp8_agg_1024x1024_c64_tp4_ep4_13",
               batch_size=16, tp=4, attention_dp=4, moe_tp=1, moe_ep=16)
    assert id_layout(row.row_id) == (64, 4, 4)
    assert id_layout_differs(row)
    plan = replay_plan(row)
    assert (plan.users, plan.tensor_parallel, plan.data_parallel) == (64, 4, 1)
    assert plan.expert_parallel
    assert plan.max_num_batched_tokens == 512 + 8192 + 1500


def test_an_id_agreeing_with_the_columns_or_naming_nothing_keeps_the_columns():
    agrees = _moe(row_id="x_agg_8192x1024_c32_tp4_ep16_1", batch_size=8, tp=4,
                  attention_dp=4, moe_tp=1, moe_ep=16)
    assert not id_layout_differs(agrees)
    assert replay_plan(agrees).data_parallel == 4
    assert id_layout("dense") is None and not id_layout_differs(DENSE)
    ids_with_layout = _moe(row_id="x_agg_8192x1024_c8_tp4_0_ep4_0_7")
    assert id_layout(ids_with_layout.row_id) == (8, 4, 4)
    assert not id_layout_differs(ids_with_layout)


def test_only_minimax_rows_in_the_shipped_file_name_another_layout_in_their_id():
    differ = [row for row in load_rows() if id_layout_differs(row)]
    assert len(differ) == 15
    assert {row.model for row in differ} == {"MiniMaxAI/MiniMax-M2.5"}


def test_kv_cache_is_the_generators_auto_for_fp8_and_16_bit_rows():
    """The generator writes the estimate's KV mode as --kv-cache-dtype; the rows name GEMM
    and MoE modes only and their checkpoints no KV scheme, so every row runs auto, and the
    deployment resolves it to the 16-bit cache."""
    llama = replace(DENSE, model="meta-llama/Llama-3.1-70B", precision="fp8",
                    gemm_quant="fp8", moe_quant="fp8")
    for row in (DENSE, llama):
        plan = replay_plan(row)
        assert plan.kv_cache_dtype == "auto"
        deployment = row_deployment(row_model(row), plan)
        assert deployment.kv_cache_dtype == "auto"
        assert deployment.kv_bytes_per_token == deployment.model.kv_bytes_per_token(2)


def test_batch_at_or_above_512_doubles_max_num_seqs():
    assert replay_plan(replace(DENSE, batch_size=511)).max_num_seqs == 512
    plan = replay_plan(replace(DENSE, batch_size=512))
    assert plan.max_num_seqs == 1024
    assert plan.max_num_batched_tokens == 1024 + 1024 + 1500


def test_rows_servelab_cannot_price_are_refused_with_the_reason():
    with pytest.raises(RowRefused, match="precision fp4"):
        replay_plan(replace(DENSE, precision="fp4", gemm_quant="nvfp4"))
    with pytest.raises(RowRefused, match="pipeline parallel 2"):
        replay_plan(replace(DENSE, pp=2))
    # fp4 means the checkpoint's own MXFP4 experts only where the checkpoint has them.
    assert "precision fp4" in simulate_row(replace(DENSE, precision="fp4")).refused
    assert "no model config" in simulate_row(replace(DENSE, model="acme/none")).refused


def test_gpt_oss_fp4_rows_serve_the_checkpoints_mxfp4_experts_without_quantization():
    row = replace(DENSE, model="openai/gpt-oss-120b", precision="fp4", gemm_quant="nvfp4",
                  moe_quant="nvfp4", tp=2, isl=256, osl=4, batch_size=2)
    result = simulate_row(row, rounds=1)
    assert result.simulated, result.refused
    plan = replay_plan(replace(row, precision=""))
    deployment = row_deployment(row_model(row), plan)
    assert deployment.quantization is None and "mxfp4 experts" in deployment.description


def test_data_parallel_with_expert_parallel_replays_its_closed_loop_in_lockstep():
    row = replace(DENSE, model="Qwen/Qwen3-30B-A3B", tp=1, attention_dp=2, moe_tp=1,
                  moe_ep=2, isl=64, osl=4, batch_size=2)
    result = simulate_row(row, rounds=2)
    assert result.simulated, result.refused
    assert result.ttft_ms > 0 and result.tpot_ms > 0


def _done(ttft_s: float, tokens: int, gap_s: float) -> Request:
    request = Request("r", 0.0, 8, tokens)
    request.token_times_s = [ttft_s + k * gap_s for k in range(tokens)]
    request.finish_s, request.finish_reason = request.token_times_s[-1], FinishReason.LENGTH
    return request


def test_means_average_every_measured_request():
    requests = [_done(0.1, 3, 0.02), _done(0.3, 3, 0.04)]
    ttft_ms, tpot_ms = measured_means(requests)
    assert ttft_ms == pytest.approx(200.0)
    assert tpot_ms == pytest.approx(30.0)


def test_means_refuse_a_run_with_unfinished_requests():
    with pytest.raises(RowRefused, match=r"1 requests did not complete \(late: unfinished\)"):
        measured_means([_done(0.1, 3, 0.02), Request("late", 0.0, 8, 3)])


def test_replay_sends_the_measured_requests_only_all_users_at_once():
    """aiperf drains the warm-up before measuring, which leaves a simulated engine as it was."""
    row = replace(DENSE, isl=64, osl=4, batch_size=3)
    plan = replay_plan(row, rounds=2)
    requests = run_closed_loop(plan, row_deployment(row_model(row), plan))
    assert len(requests) == plan.measured_requests == 6
    assert [r.arrival_s for r in requests[:3]] == [0.0, 0.0, 0.0]
    # The fourth request waits for the first answer.
    assert requests[3].arrival_s == pytest.approx(min(r.finish_s for r in requests[:3]))


def test_replay_can_start_each_user_at_its_own_time():
    row = replace(DENSE, isl=64, osl=4, batch_size=3)
    plan = replay_plan(row, rounds=2)
    deployment = row_deployment(row_model(row), plan)
    requests = run_closed_loop(plan, deployment, first_send_s=[0.0, 0.5, 1.0])
    assert [r.arrival_s for r in requests[:3]] == [0.0, 0.5, 1.0]
    assert all(r.token_times_s[0] > r.arrival_s for r in requests)
    # The next request goes with the first user free: the one that started first.
    assert requests[3].arrival_s == pytest.approx(requests[0].finish_s)
    with pytest.raises(ValueError, match="one time per user: 2 for 3 users"):
        run_closed_loop(plan, deployment, first_send_s=[0.0, 0.5])


def test_error_stats_give_signed_median_and_p90_of_magnitude():
    stats = error_stats([-0.5, 0.1, 0.2, 0.3, -0.05])
    assert stats["median"] == pytest.approx(0.1)
    assert stats["p90_abs"] == pytest.approx(0.42)
    assert error_stats([]) == {"median": None, "p90_abs": None}


def test_error_table_groups_by_model_tp_precision_and_counts_refusals():
    results = [RowResult(DENSE, 165.0, 18.0), RowResult(DENSE, 135.0, 19.8),
               RowResult(replace(DENSE, tp=4), None, None, "why"),
               RowResult(replace(DENSE, precision="fp8"), 300.0, 9.0)]
    assert results[0].ttft_error == pytest.approx(0.1)
    table = error_table(results)
    assert [(g["model"], g["tp"], g["precision"], g["rows"], g["simulated"]) for g in table] == [
        ("Qwen/Qwen3-32B", 2, "bf16", 2, 2), ("Qwen/Qwen3-32B", 2, "fp8", 1, 1),
        ("Qwen/Qwen3-32B", 4, "bf16", 1, 0), ("all", "-", "-", 4, 3)]
    assert table[0]["ttft_median"] == pytest.approx(0.0)
    assert table[0]["tpot_median"] == pytest.approx(0.05)
    assert table[2]["ttft_median"] is None
    assert table[3]["ttft_median"] == pytest.approx(0.1)
    assert refusals(results) == {"why": 1}


def test_a_small_row_replays_end_to_end_near_its_step_times():
    row = replace(DENSE, isl=256, osl=8, batch_size=2)
    result = simulate_row(row, rounds=2)
    assert result.simulated, result.refused
    # Two users: a prefill of at most two prompts, then decode steps of at most two rows.
    assert 0 < result.ttft_ms < 1000
    assert 0 < result.tpot_ms < result.ttft_ms


def test_shipped_rows_load_and_every_one_has_a_measurement():
    rows = load_rows()
    assert len(rows) == 237
    assert {r.model for r in rows} == {"Qwen/Qwen3-32B", "openai/gpt-oss-120b",
                                       "meta-llama/Llama-3.1-70B", "MiniMaxAI/MiniMax-M2.5"}
    assert all(r.ttft_ms > 0 and r.tpot_ms > 0 for r in rows)


def _record(**changes) -> dict[str, str]:
    record = {"id": "x", "silicon_data_source": "silicon_concurrency=8", "backend": "vllm",
              "mode": "agg", "system": "h100_sxm", "model_path": "Qwen/Qwen3-32B",
              "backend_version": "", "precision": "", "gemm_quant_mode": "",
              "moe_quant_mode": "", "isl": "1024", "osl": "128", "batch_size": "8",
              "tp_size": "2", "pp_size": "1", "attention_dp_size": "", "moe_tp_size": "1",
              "moe_ep_size": "1", "silicon_ttft_ms": "150.5", "silicon_tpot_ms": "18.25"}
    return record | changes


def _write(path: Path, records: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    return path


def test_extract_keeps_only_h100_vllm_aggregated_rows(tmp_path):
    source = _write(tmp_path / "source.csv", [
        _record(id="keep"), _record(id="sglang", backend="sglang"),
        _record(id="disagg", mode="disagg"), _record(id="b200", system="b200_sxm")])
    out = tmp_path / "rows.csv"
    assert extract(source, out) == 1
    with out.open() as f:
        records = list(csv.DictReader(f))
    assert [r["id"] for r in records] == ["keep"]
    assert tuple(records[0]) == COLUMNS
    assert load_rows(out)[0].ttft_ms == 150.5


def test_extract_rejects_a_stated_concurrency_that_is_not_the_batch(tmp_path):
    source = _write(tmp_path / "source.csv", [_record(silicon_data_source="silicon_concurrency=9")])
    with pytest.raises(ValueError, match="concurrency 9"):
        extract(source, tmp_path / "rows.csv")


def test_parse_row_names_the_row_and_the_bad_field():
    with pytest.raises(ValueError, match="silicon row x: no column isl"):
        parse_row({k: v for k, v in _record().items() if k != "isl"})
    with pytest.raises(ValueError, match="silicon row x"):
        parse_row(_record(osl="many"))
