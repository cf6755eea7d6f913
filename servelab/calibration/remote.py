"""Calibration from outside: a streaming server's step times, read off the token timestamps a
client sees under probes whose batches are known.

Three kinds of probe. `decode`: k streams at once; once all have their first token and
until one ends, every gap between two tokens of a stream is one step of k decodes, and before
that their first tokens come back in groups, one per step that admitted them. `lone`:
one prompt on an idle server; its TTFT is the request's path through the server plus its
prefill step(s), and its later gaps are one-row decodes. `join`: a prompt sent while k
streams decode; the gaps of a decoding stream around the prompt's first token are steps
mixing the k decodes with the prompt's chunks, and its TTFT, less half a decode step (the
mean wait for the step in flight), is the request path plus those steps.

Each observation is a sum of BatchPlans (built as the server's chunked scheduler would)
and seconds; one non-negative fit gives the cost model's coefficients and the request
overhead (the path through the server, which only TTFTs include) together, leaving out the
observations that no fit explains (`inliers`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from executor.calibration.fit import HOLDOUT_FOLDS, Fit, held_out_errors
from sim.cost.calibrated import (
    CalibratedCostModel,
    check_knots,
    feature_names,
    fit_coefficients,
    plan_features,
)
from sim.engine.batch_plan import add_to_plan
from sim.engine.core import BatchPlan, Request

DECODE_WINDOW = 8  # decode gaps per observation: their median damps client-side hiccups
# An observation off the fit by more than OUTLIER_ERROR x the median error, and by more than
# OUTLIER_FLOOR, is a glitch in the client's view of the server and is left out of the fit.
OUTLIER_ERROR, OUTLIER_FLOOR, OUTLIER_ROUNDS = 4.0, 0.25, 8


@dataclass(frozen=True)
class ServerLimits:
    """The server's scheduler limits: what it publishes, the rest from flags."""

    max_model_len: int
    token_budget: int  # tokens per step (vLLM's max_num_batched_tokens)
    max_num_seqs: int
    block_size: int | None = None  # KV block size, where /metrics publishes it
    num_blocks: int | None = None  # KV pool, where /metrics publishes it
    enable_prefix_caching: bool = True
    # Row counts where the server's decode step cost changes slope (its GEMM's tiles), where
    # it publishes them (`servelab serve` does, as servelab:kernel_info): the fit gets a
    # fixed cost per knot (sim.cost.calibrated), and the decode probes run a batch at each.
    row_knots: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for key in ("max_model_len", "token_budget", "max_num_seqs"):
            if getattr(self, key) < 1:
                raise ValueError(f"server {key} must be >= 1, got {getattr(self, key)}")
        check_knots(self.row_knots)


@dataclass(frozen=True)
class ProbeRequest:
    """One request of a probe: sent `send_s` after the probe starts."""

    send_s: float
    prompt_len: int
    max_tokens: int


@dataclass(frozen=True)
class Probe:
    """Requests sent together and waited for: `kind` is decode, lone or join; a join
    probe's first `num_streams` requests are the decoding streams."""

    kind: str
    requests: tuple[ProbeRequest, ...]
    num_streams: int = 0


@dataclass
class Observations:
    """Rows of summed plan features (+ the request-overhead column) and their seconds."""

    row_knots: tuple[int, ...] = ()
    rows: list[list[float]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)

    @property
    def names(self) -> tuple[str, ...]:
        return feature_names(self.row_knots) + ("overhead",)

    def add(self, plans: list[BatchPlan], seconds: float, kind: str,
            overhead: bool = False) -> None:
        if not seconds > 0 or not plans:
            return  # a stall of the client's clock or nothing observed: no information
        summed = np.sum([plan_features(plan, self.row_knots) for plan in plans],
                        axis=0).tolist()
        self.rows.append(summed + [1.0 if overhead else 0.0])
        self.seconds.append(seconds)
        self.kinds.append(kind)


def probes(limits: ServerLimits, quick: bool = False) -> list[Probe]:
    """The lone and decode probes: prompt lengths up to two steps' budget, batches of powers
    of two and at every row knot up to max_num_seqs. (Join probes need the decode step
    time: `join_probes`.)"""
    longest = min(limits.max_model_len - 64, 2 * limits.token_budget)
    lengths = [n for n in (16, 128, 512, 1024, 2048, 4096) if n <= longest]
    lone = [Probe("lone", (ProbeRequest(0.0, n, 8),)) for n in lengths for _ in range(2)]
    batches = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= limits.max_num_seqs]
    contexts = [n for n in (32, 512, 1536) if n + 80 <= limits.max_model_len]
    if quick:
        lone, batches, contexts = lone[::2], batches[::2], contexts[:2]
    batches = sorted(set(batches) | {k for k in limits.row_knots if k <= limits.max_num_seqs})
    pool = (limits.num_blocks * limits.block_size if limits.num_blocks and limits.block_size
            else None)  # a batch that outgrows the pool would be preempted: other steps

    def fits(k: int, n: int) -> bool:
        return k * n <= 16 * limits.token_budget and (pool is None or k * (n + 64) <= pool)

    decode = [Probe("decode", tuple(ProbeRequest(0.0, n, 48) for _ in range(k)))
              for n in contexts for k in batches if fits(k, n)]
    return lone + decode


def join_probes(limits: ServerLimits, decode_step_s: float, quick: bool = False) -> list[Probe]:
    """k streams decoding, joined one after another by prompts of several lengths, each
    once the last one's prefill is surely over (spacing from a decode step's time)."""
    lengths = [n for n in (64, 256, 1024, 2048) if n <= min(limits.max_model_len - 8,
                                                               limits.token_budget)]
    streams = [k for k in (1, 4, 16) if k < limits.max_num_seqs]
    if quick:
        streams = streams[:2]
    out = []
    rng = np.random.default_rng(0)
    for k in streams:
        start = 12 * decode_step_s + 0.2  # the streams' prefills are over
        gap = 40 * decode_step_s + 0.05
        joins = [ProbeRequest(start + i * gap + rng.uniform(0, decode_step_s), n, 1)
                 for i, n in enumerate(lengths * 2)]
        steps = int((joins[-1].send_s + gap) / decode_step_s) + 16
        decoding = [ProbeRequest(0.0, 32, min(steps, limits.max_model_len - 40))] * k
        out.append(Probe("join", tuple(decoding + joins), num_streams=k))
    return out


def _decoding(prompt_len: int, num_tokens: int, rid: str) -> Request:
    """A request that has produced num_tokens tokens and decodes its next one."""
    request = Request(rid, 0.0, prompt_len, num_tokens + 1)
    request.token_times_s = [0.0] * num_tokens
    request.num_computed_tokens = prompt_len + num_tokens - 1
    return request


def _decode_plan(streams: list[tuple[int, int]]) -> BatchPlan:
    """One step decoding each (prompt_len, tokens so far) stream."""
    plan = BatchPlan()
    for i, (prompt_len, tokens) in enumerate(streams):
        add_to_plan(plan, _decoding(prompt_len, tokens, f"d{i}"), 1)
    return plan


def _chunk_plans(prompt_len: int, budget: int, streams: list[tuple[int, int]]
                 ) -> list[BatchPlan]:
    """The steps that prefill a prompt beside decoding streams, chunked as the budget allows."""
    plans, done = [], 0
    while done < prompt_len:
        plan = _decode_plan(streams)
        chunk = min(prompt_len - done, budget - len(streams))
        request = Request("p", 0.0, prompt_len, 1)
        request.num_computed_tokens = done
        add_to_plan(plan, request, chunk)
        plans.append(plan)
        done += chunk
        streams = [(p, n + 1) for p, n in streams]
    return plans


def observe(probe: Probe, seen: list[Request], limits: ServerLimits, out: Observations) -> None:
    """Add what one probe's measured requests (arrival_s = send, token_times_s) show."""
    if any(len(r.token_times_s) != r.max_new_tokens for r in seen):
        raise ValueError(f"a {probe.kind} probe came back incomplete: the server must stream "
                         "every token and honour max_tokens with ignore_eos")
    if probe.kind == "lone":
        _observe_lone(seen[0], limits, out)
    elif probe.kind == "decode":
        _observe_decodes(seen, limits, out)
    else:
        _observe_joins(seen[:probe.num_streams], seen[probe.num_streams:], limits, out)


def _observe_lone(request: Request, limits: ServerLimits, out: Observations) -> None:
    times = request.token_times_s
    out.add(_chunk_plans(request.prompt_len, limits.token_budget, []),
            times[0] - request.arrival_s, "lone TTFT", overhead=True)
    if len(times) > 1:  # one observation: the median gap, as a decode window's
        middle = len(times) // 2
        out.add([_decode_plan([(request.prompt_len, middle)])],
                float(np.median(np.diff(times))), "decode")


def _observe_decodes(streams: list[Request], limits: ServerLimits, out: Observations) -> None:
    """Windows of DECODE_WINDOW gaps of the first stream while every stream decodes, and
    the steps that admitted the streams (when their prompts fit one step together)."""
    start = max(s.token_times_s[0] for s in streams)
    end = min(s.token_times_s[-1] for s in streams)
    times = np.asarray(streams[0].token_times_s)
    inside = [j for j in range(1, len(times)) if times[j - 1] >= start and times[j] <= end]
    if inside and sum(s.prompt_len for s in streams) <= limits.token_budget:
        step_s = float(np.median(np.diff(times)[[j - 1 for j in inside]]))
        _observe_admissions(streams, 0.3 * step_s, out)
    for w in range(0, len(inside) - DECODE_WINDOW + 1, DECODE_WINDOW):
        window = inside[w:w + DECODE_WINDOW]
        middle = times[window[len(window) // 2]]
        shape = [(s.prompt_len, int(np.searchsorted(s.token_times_s, middle, "right")))
                 for s in streams]
        gaps = times[window] - times[[j - 1 for j in window]]
        out.add([_decode_plan(shape)], float(np.median(gaps)), "decode")


def _observe_admissions(streams: list[Request], tolerance_s: float, out: Observations) -> None:
    """Streams sent at once reach the server over a few milliseconds: the first step
    prefills those there by then, the next the rest beside the first ones' decodes, and so
    on. Streams whose first tokens arrive within tolerance_s share a step."""
    ordered = sorted(streams, key=lambda s: s.token_times_s[0])
    groups: list[list[Request]] = [[ordered[0]]]
    for stream in ordered[1:]:
        if stream.token_times_s[0] - groups[-1][0].token_times_s[0] <= tolerance_s:
            groups[-1].append(stream)
        else:
            groups.append([stream])
    running: list[tuple[int, int]] = []  # (prompt_len, tokens so far) of admitted streams
    for i, group in enumerate(groups):
        plan = _decode_plan(running)
        for stream in group:
            add_to_plan(plan, Request(stream.request_id, 0.0, stream.prompt_len, 1),
                        stream.prompt_len)
        first = group[0].token_times_s[0]
        if i == 0:  # an idle server: the first arrival's TTFT is its path plus this step
            out.add([plan], first - min(s.arrival_s for s in group), "burst TTFT",
                    overhead=True)
        else:
            out.add([plan], first - groups[i - 1][0].token_times_s[0], "burst")
        running = [(p, n + 1) for p, n in running] + [(s.prompt_len, 1) for s in group]


def _observe_joins(streams: list[Request], joins: list[Request], limits: ServerLimits,
                   out: Observations) -> None:
    """Each join's chunk steps as gaps of the first stream, and its TTFT less half a step."""
    times = np.asarray(streams[0].token_times_s)
    for join in joins:
        first = join.token_times_s[0]
        if not times[0] < join.arrival_s and first < times[-1]:
            continue  # the stream was not decoding all along this join
        m = int(np.argmin(np.abs(times - first)))  # the stream's token of the last chunk step
        shape = [(s.prompt_len, int(np.searchsorted(s.token_times_s, join.arrival_s, "right")))
                 for s in streams]
        plans = _chunk_plans(join.prompt_len, limits.token_budget, shape)
        before = m - len(plans)  # the step in flight when the prompt arrived ended here
        if before < 1 or any(n < 1 for _, n in shape):
            continue  # the other streams were not all decoding around this join
        for i, plan in enumerate(plans):
            g = before + 1 + i
            out.add([plan], float(times[g] - times[g - 1]), "mixed")
        in_flight = float(times[before] - times[before - 1])
        out.add(plans, first - join.arrival_s - in_flight / 2, "join TTFT", overhead=True)


def median_decode_step(out: Observations, rows: int = 4) -> float:
    """The median decode-only step at <= rows rows: how far apart to send join probes."""
    sampled = out.names.index("sampled")
    chosen = [s for row, s, kind in zip(out.rows, out.seconds, out.kinds, strict=True)
              if kind == "decode" and row[sampled] <= rows]
    if not chosen:
        raise ValueError("no decode steps observed: the server's stream gave no token gaps")
    return float(np.median(chosen))


def fit_observations(out: Observations) -> tuple[Fit, np.ndarray]:
    """The cost model and request overhead fitted to the observations a fit explains (see
    `inliers`), with each one's held-out error (a fit without its fold); and which those are."""
    features = np.asarray(out.rows, dtype=float)
    seconds = np.asarray(out.seconds, dtype=float)
    needed = len(out.names) + HOLDOUT_FOLDS
    if len(seconds) < needed:
        raise ValueError(f"{len(seconds)} observations are too few to fit {len(out.names)} "
                         "terms: probe longer")
    keep = inliers(features, seconds)
    features, seconds = features[keep], seconds[keep]
    if len(seconds) < needed:
        raise ValueError(f"{len(seconds)} observations fit together ({(~keep).sum()} left out), "
                         f"too few to fit {len(out.names)} terms: probe longer")
    held = held_out_errors(features, seconds)
    solution = fit_coefficients(features, seconds)
    model = CalibratedCostModel(tuple(solution[:-1]), out.row_knots,
                                request_overhead_s=float(solution[-1]))
    fitted = np.abs(features @ solution - seconds) / seconds
    return Fit(model, fitted, held), keep


def inliers(features: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """The observations left once those no fit explains are: fit, set aside each observation
    off the fit by more than OUTLIER_ERROR median errors (and OUTLIER_FLOOR), fit the rest,
    until the set stops changing. What a client sees of a step can be far off it (a token
    held back in a socket shortens the next gap; a burst's group split in two shortens its
    step), and a relative-error fit follows a gap that is too short more than one too long."""
    keep = np.ones(len(seconds), dtype=bool)
    for _ in range(OUTLIER_ROUNDS):
        coefficients = fit_coefficients(features[keep], seconds[keep])
        errors = np.abs(features @ coefficients - seconds) / seconds
        bound = max(OUTLIER_ERROR * float(np.median(errors[keep])), OUTLIER_FLOOR)
        if np.array_equal(errors <= bound, keep):
            break
        keep = errors <= bound
    return keep


def error_by_kind(out: Observations, errors: np.ndarray, kept: np.ndarray) -> dict[str, float]:
    """Median error of each kind of observation, errors being those of the `kept` ones."""
    kinds = np.asarray(out.kinds)[kept]
    return {kind: float(np.median(errors[kinds == kind])) for kind in dict.fromkeys(kinds)}


def outliers_by_kind(out: Observations, kept: np.ndarray) -> dict[str, int]:
    """How many observations of each kind the fit left out."""
    kinds = np.asarray(out.kinds)[~kept]
    return {str(kind): int((kinds == kind).sum()) for kind in dict.fromkeys(kinds)}
