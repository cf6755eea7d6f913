"""AIConfigurator's measured H100 vLLM runs ("silicon rows") and the engine each ran.

A row is one whole run: aiperf's closed loop of `users` users sending fixed-length prompts
with ignore_eos, 20 x users requests after 2 x users warm-up ones; mean TTFT and TPOT in ms.
`replay_plan` turns a row into the vLLM engine AIConfigurator's generator launched for it
(its vLLM rule): one unified TP, data parallel ranks, its limits. `extract` filters the
source CSV to the shipped file (sim/data/aiconfigurator/SILICON.md):

    python -m sim.measured.silicon_rows SOURCE.csv [--out FILE]
"""

from __future__ import annotations

import argparse
import csv
import re
from dataclasses import dataclass
from pathlib import Path

import sim

SILICON_DIR = Path(sim.__file__).parent / "data" / "aiconfigurator"
ROWS_CSV = SILICON_DIR / "silicon_h100_vllm.csv"
MODELS_DIR = SILICON_DIR / "silicon_models"  # configs of row models servelab does not ship

# The rows kept: vLLM, aggregated serving, H100 SXM. Every other row stays out.
FILTER = {"backend": "vllm", "mode": "agg", "system": "h100_sxm"}
# The source's columns kept, in its own names (what AIConfigurator's estimate API takes).
COLUMNS = ("id", "model_path", "backend_version", "precision", "gemm_quant_mode",
           "moe_quant_mode", "isl", "osl", "batch_size", "tp_size", "pp_size",
           "attention_dp_size", "moe_tp_size", "moe_ep_size", "silicon_ttft_ms",
           "silicon_tpot_ms")
HARDWARE = "h100"  # servelab's GPU preset for h100_sxm
WARMUP_ROUNDS = 2  # aiperf --warmup-request-count = 2 x concurrency
MEASURED_ROUNDS = 20  # aiperf --num-requests = 20 x concurrency
# The generator's vLLM limits: max_num_seqs 512 (twice the batch above it); the token
# budget and context leave 1,500 tokens of slack over the batch and the prompt.
MIN_MAX_NUM_SEQS = 512
SLACK_TOKENS = 1500
# Row precision -> vLLM --quantization as servelab prices it ("" and bf16: 16-bit weights).
QUANTIZATION = {"": None, "bf16": None, "fp16": None, "fp8": "fp8"}
# The generator's vLLM --kv-cache-dtype: its estimate's KV quant mode, "bfloat16" written as
# auto. A row states GEMM and MoE modes only, so the KV mode comes from the row model's
# checkpoint (fp8 where its quantization_config names an FP8 KV cache, else bfloat16): the
# rows' checkpoints are 16-bit ones (meta-llama/Llama-3.1-70B, Qwen/Qwen3-32B), so auto,
# which is also what servelab's own checkpoint rule gives them.
KV_CACHE_DTYPE = "auto"
# A row id names the layout its run had: ..._c{users}_tp{tp}[_0]_ep{ep}[_0]_...
ID_LAYOUT = re.compile(r"_c(\d+)_tp(\d+)(?:_0)?_ep(\d+)(?:_0)?_")


class RowRefused(ValueError):
    """A row servelab cannot simulate, with the reason."""


@dataclass(frozen=True)
class SiliconRow:
    """One measured run (the shipped CSV's columns, parsed; empty counts as 1 or 0)."""

    row_id: str
    model: str  # Hugging Face id
    engine_version: str  # vLLM's version, "" where the source did not record it
    precision: str  # "" (16-bit), fp8, fp4
    gemm_quant: str
    moe_quant: str
    isl: int  # prompt tokens
    osl: int  # output tokens (ignore_eos)
    batch_size: int  # requests in flight per attention-DP rank
    tp: int
    pp: int
    attention_dp: int
    moe_tp: int
    moe_ep: int
    ttft_ms: float  # measured mean
    tpot_ms: float  # measured mean


@dataclass(frozen=True)
class ReplayPlan:
    """The load and the engine of one row, as vLLM's flags name them."""

    users: int
    warmup_requests: int  # sent first, all answered before the measured ones are sent
    measured_requests: int
    prompt_len: int
    output_len: int
    tensor_parallel: int
    data_parallel: int
    expert_parallel: bool
    quantization: str | None
    kv_cache_dtype: str  # vLLM's --kv-cache-dtype as the generator sets it (KV_CACHE_DTYPE)
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


def _int(text: str, default: int) -> int:
    return int(text) if text.strip() else default


def parse_row(record: dict[str, str]) -> SiliconRow:
    """A SiliconRow from one CSV record; ValueError naming the row and the field."""
    row_id = record.get("id", "?")
    try:
        return SiliconRow(
            row_id, record["model_path"], record["backend_version"], record["precision"],
            record["gemm_quant_mode"], record["moe_quant_mode"], int(record["isl"]),
            int(record["osl"]), int(record["batch_size"]), _int(record["tp_size"], 1),
            _int(record["pp_size"], 1), _int(record["attention_dp_size"], 1),
            _int(record["moe_tp_size"], 0), _int(record["moe_ep_size"], 0),
            float(record["silicon_ttft_ms"]), float(record["silicon_tpot_ms"]))
    except KeyError as missing:
        raise ValueError(f"silicon row {row_id}: no column {missing.args[0]}") from None
    except ValueError as error:
        raise ValueError(f"silicon row {row_id}: {error}") from None


def load_rows(path: Path = ROWS_CSV) -> list[SiliconRow]:
    """The shipped rows, in file order."""
    with path.open(newline="") as f:
        return [parse_row(record) for record in csv.DictReader(f)]


def replay_plan(row: SiliconRow, rounds: int = MEASURED_ROUNDS) -> ReplayPlan:
    """The engine and load the generator set up for `row`; RowRefused for what servelab
    does not simulate (pipeline parallel, a precision it does not price)."""
    if row.pp != 1:
        raise RowRefused(f"pipeline parallel {row.pp} is not simulated")
    if row.precision not in QUANTIZATION:
        raise RowRefused(f"precision {row.precision} (GEMM {row.gemm_quant or '-'}, MoE "
                         f"{row.moe_quant or '-'}) is not priced; 16-bit and fp8 weights are")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    users, tp, dp, ep = run_layout(row)
    batch = users // dp
    seqs = MIN_MAX_NUM_SEQS if batch < MIN_MAX_NUM_SEQS else 2 * batch
    return ReplayPlan(
        users=users, warmup_requests=WARMUP_ROUNDS * users, measured_requests=rounds * users,
        prompt_len=row.isl, output_len=row.osl, tensor_parallel=tp, data_parallel=dp,
        expert_parallel=ep > 1, quantization=QUANTIZATION[row.precision],
        kv_cache_dtype=KV_CACHE_DTYPE,
        max_num_seqs=seqs, max_num_batched_tokens=seqs + row.isl + SLACK_TOKENS,
        max_model_len=row.isl + row.osl + SLACK_TOKENS)


def run_layout(row: SiliconRow) -> tuple[int, int, int, int]:
    """(users, vLLM's unified TP, DP ranks, expert-parallel ranks) of the row's run: its
    columns as the generator reads them, or one engine as the row's id names it where the
    two differ (id_layout_differs)."""
    if id_layout_differs(row):
        users, tp, ep = id_layout(row.row_id)
        return users, tp, 1, ep
    return _column_layout(row)


def _column_layout(row: SiliconRow) -> tuple[int, int, int, int]:
    dp = row.attention_dp
    # vLLM has one TP for attention and experts: the generator's MoE rule sets it to
    # moe_tp x moe_ep / dp, which never falls below the attention TP of a valid layout.
    return (row.batch_size * dp, max(row.tp, row.moe_tp * row.moe_ep // dp), dp,
            max(row.moe_ep, 1))


def id_layout(row_id: str) -> tuple[int, int, int] | None:
    """(users, TP, EP) that a row id names, or None when it names none."""
    found = ID_LAYOUT.search(row_id)
    return None if found is None else tuple(int(g) for g in found.groups())


def id_layout_differs(row: SiliconRow) -> bool:
    """Whether the row's id names a layout its columns do not give. In the shipped rows,
    MiniMax-M2.5's 15 rows whose columns read 4 attention-DP ranks over 16 expert ranks
    carry ids naming one TP 4 / EP 4 engine at the same users, and 13 of them measured the
    TTFT and TPOT of the TP 4 / EP 4 rows at the same users within a few percent
    (sim/data/aiconfigurator/SILICON.md): the id is the run."""
    named = id_layout(row.row_id)
    users, tp, _, ep = _column_layout(row)
    return named is not None and named != (users, tp, ep)


def _kept(record: dict[str, str]) -> bool:
    return all(record[key] == value for key, value in FILTER.items())


def _check_concurrency(record: dict[str, str]) -> None:
    """The concurrency the source states (when it does) is the batch over the DP ranks."""
    stated = re.search(r"silicon_concurrency=(\d+)", record.get("silicon_data_source", ""))
    users = int(record["batch_size"]) * _int(record["attention_dp_size"], 1)
    if stated and int(stated.group(1)) != users:
        raise ValueError(f"silicon row {record['id']}: concurrency {stated.group(1)} is not "
                         f"batch_size x attention_dp_size = {users}")


def extract(source: Path, out: Path = ROWS_CSV) -> int:
    """Write the FILTER rows of AIConfigurator's silicon_sample.csv to `out` (COLUMNS
    only); the number of rows written."""
    with source.open(newline="") as f:
        records = [r for r in csv.DictReader(f) if _kept(r)]
    for record in records:
        _check_concurrency(record)
        parse_row(record)  # every kept row must parse
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore",
                                lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
    return len(records)


def main() -> None:
    parser = argparse.ArgumentParser(description="extract the H100 vLLM aggregated rows")
    parser.add_argument("source", type=Path, help="AIConfigurator's silicon_sample.csv")
    parser.add_argument("--out", type=Path, default=ROWS_CSV)
    args = parser.parse_args()
    print(f"wrote {extract(args.source, args.out)} rows to {args.out}")


if __name__ == "__main__":
    main()
