"""The SLO flags every replaying command shares: goodput bounds (each request's own TTFT and
TPOT, as vLLM's benchmark spells them) and p99 targets (a run holds them or not)."""

from __future__ import annotations

import argparse
import math

from sim.replay.metrics import Slo


def add_goodput_args(parser: argparse.ArgumentParser) -> None:
    """--goodput as `vllm bench serve` spells it; --slo-ttft-ms / --slo-tpot-ms, the old
    spellings, stay as hidden aliases."""
    parser.add_argument("--goodput", nargs="+", default=None, metavar="KEY:VALUE",
                        help="goodput: requests/s whose own TTFT and TPOT meet these bounds "
                             "in ms, e.g. ttft:200 tpot:50 (as vLLM's benchmark)")
    parser.add_argument("--slo-ttft-ms", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--slo-tpot-ms", type=float, default=None, help=argparse.SUPPRESS)


def add_slo_p99_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                     ttft_ms: float | None, itl_ms: float | None, what: str) -> None:
    """--slo-ttft-p99-ms and --slo-itl-p99-ms: the percentile targets a run holds or not."""
    for metric, default in (("ttft", ttft_ms), ("itl", itl_ms)):
        name = metric.upper()
        shown = "" if default is None else f" (default {default:g})"
        parser.add_argument(f"--slo-{metric}-p99-ms", type=float, default=default, metavar="MS",
                            help=f"p99 {name} target in ms: {what}{shown}")


def slo_p99_verdicts(results: dict[str, dict], ttft_p99_ms: float | None,
                     itl_p99_ms: float | None) -> str:
    """One line per run: whether its p99 TTFT and p99 ITL held the targets given ('' if
    none was)."""
    targets = [(key, bound) for key, bound in (("p99_ttft_ms", ttft_p99_ms),
                                               ("p99_itl_ms", itl_p99_ms)) if bound is not None]
    if not targets:
        return ""
    lines = []
    for name, summary in results.items():
        parts = [f"{key.removesuffix('_ms')} {summary.get(key) or math.nan:.1f} ms "
                 f"{'<=' if _held(summary.get(key), bound) else '>'} {bound:g}"
                 for key, bound in targets]
        held = all(_held(summary.get(key), bound) for key, bound in targets)
        summary["slo_p99_held"] = held
        lines.append(f"{name}: {'holds' if held else 'misses'} the SLO ({', '.join(parts)})")
    return "\n".join(lines)


def _held(value: float | None, bound: float) -> bool:
    return value is not None and value <= bound


def slo_from_args(args: argparse.Namespace) -> Slo | None:
    """The goodput bounds --goodput (or the old --slo-ttft-ms / --slo-tpot-ms) give."""
    old = {"ttft": args.slo_ttft_ms, "tpot": args.slo_tpot_ms}
    given = {key: bound for key, bound in old.items() if bound is not None}
    if args.goodput:
        if given:
            raise ValueError("--goodput and --slo-ttft-ms / --slo-tpot-ms both set goodput "
                             "bounds; give --goodput")
        from servelab.bench.vllm_flags import parse_goodput

        given = parse_goodput(args.goodput)
        if "e2el" in given:
            raise ValueError("--goodput e2el: the summary's goodput takes ttft and tpot bounds")
    if not given:
        return None
    return Slo(given.get("ttft"), given.get("tpot"))
