"""Fault injection for `servelab route`: does the router lose, hang or duplicate a request when
an upstream is killed, stopped, slow, answers 500 or garbage, or resets its connections?

Starts the upstreams (`servelab serve --model tiny` and `servelab serve --simulate`, in that
order from --upstreams), the last one behind a fault proxy in this process (it carries one
request per connection and can answer 500, answer bytes that are not HTTP, stall mid-body
or reset the connection), and `servelab route --router least-requests` over them. For each
fault it sends a mixed load of streamed and non-streamed completions, injects the fault once
a quarter of them have finished (kill -9 and SIGSTOP/SIGCONT hit the first upstream, the
others the proxied last one), and prints per fault: sent, completed, retried, failed with a
clear error (before the first byte / mid-stream), lost without an error, duplicate outputs
seen by a client, hung past the deadline, the slowest request and the router's RSS.
Run: python benchmarks/faults.py [--upstreams tiny,simulated,simulated] [--requests 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from fault_rig import FaultProxy, Process, free_port, upstream_process

FAULTS = ("none", "kill", "stop", "stall", "http500", "garbage", "reset")
SIGNALLED = ("kill", "stop")  # the others are the proxy's
HANG_SLACK_S = 5.0  # past the router's request budget: a request still open is hung


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstreams", default="tiny,simulated,simulated",
                        help="kinds, comma-separated: tiny or simulated")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"of {', '.join(FAULTS)}")
    parser.add_argument("--requests", type=int, default=60, help="per fault")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--stop-s", type=float, default=12.0, help="SIGSTOP lasts this long")
    parser.add_argument("--request-timeout-s", type=float, default=40.0,
                        help="the router's request budget (its --request-timeout-s)")
    parser.add_argument("--route-flags", default="--read-timeout-s 10",
                        help="more flags for servelab route")
    parser.add_argument("--json", type=Path, default=None, help="write the table here too")
    return parser.parse_args()


@dataclass
class Tally:
    """One fault's outcome, counted from what the clients saw."""

    sent: int = 0
    completed: int = 0
    completed_streamed: int = 0  # of those, streams (the odd requests)
    failed_before: int = 0  # a clear error (OpenAI error object) before any token
    failed_mid_stream: int = 0  # an error event, then [DONE], after tokens
    lost: int = 0  # no answer, no error: a broken connection, a stream without [DONE]
    duplicates: int = 0  # a stream that carried two upstreams' events, or two finishes
    hung: int = 0  # still open past the router's budget plus HANG_SLACK_S
    latencies_s: list[float] = field(default_factory=list)
    errors: set[str] = field(default_factory=set)  # what the failed ones said


async def one_request(session: aiohttp.ClientSession, url: str, i: int, max_tokens: int,
                      budget_s: float, tally: Tally) -> None:
    """Send request i (odd ones streamed) and count what came back."""
    streamed = i % 2 == 1
    body = {"prompt": f"request {i}: tell me about routers", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": streamed}
    start = time.monotonic()
    tally.sent += 1
    try:
        async with session.post(f"{url}/v1/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=budget_s)) as response:
            raw = await response.read()
        verdict = judge(response.status, raw, streamed)
    except asyncio.TimeoutError:
        verdict = "hung"
    except aiohttp.ClientError as exc:
        verdict, raw = "lost", repr(exc).encode()
    tally.latencies_s.append(time.monotonic() - start)
    if verdict != "completed" and len(tally.errors) < 8:
        tally.errors.add(f"{verdict}: {raw[-300:].decode(errors='replace')}")
    setattr(tally, verdict, getattr(tally, verdict) + 1)
    tally.completed_streamed += verdict == "completed" and streamed


def judge(status: int, raw: bytes, streamed: bool) -> str:
    """completed, failed_before, failed_mid_stream, lost or duplicates."""
    if status != 200 or not streamed:
        try:
            answer = json.loads(raw)
        except ValueError:
            return "lost"
        if status != 200:
            return "failed_before" if "error" in answer else "lost"
        return "completed" if len(answer.get("choices", ())) == 1 else "duplicates"
    events = [line[6:] for line in raw.decode(errors="replace").splitlines()
              if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return "lost"
    chunks = [json.loads(e) for e in events[:-1]]
    if any("error" in c for c in chunks):
        return "failed_mid_stream" if len(chunks) > 1 else "failed_before"
    ids = {c.get("id") for c in chunks}
    finishes = sum(1 for c in chunks for ch in c.get("choices", ()) if ch.get("finish_reason"))
    if len(ids) > 1 or finishes > 1:
        return "duplicates"
    return "completed" if finishes == 1 else "lost"


async def router_sum(session: aiohttp.ClientSession, url: str, prefix: str) -> float:
    """The sum of the router's samples whose line starts with `prefix`."""
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


async def until_all_healthy(session: aiohttp.ClientSession, url: str, limit_s: float) -> None:
    """Wait (at most limit_s) until the router has every upstream back in rotation."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        async with session.get(f"{url}/health") as response:
            upstreams = (await response.json())["upstreams"]
        if all(u["state"] == "healthy" and u["reachable"] for u in upstreams):
            return
        await asyncio.sleep(0.5)
    print(f"  (not every upstream back in rotation after {limit_s:.0f} s)", file=sys.stderr)


@dataclass
class Rig:
    """The running upstreams, the proxy in front of the last one, and the router."""

    upstreams: list[Process]
    proxy: FaultProxy
    router: Process
    url: str


async def inject(fault: str, rig: Rig, stop_s: float) -> asyncio.Task | None:
    """Start the fault; the task (if any) that ends it on its own."""
    if fault == "kill":
        rig.upstreams[0].signal(signal.SIGKILL)
    elif fault == "stop":
        rig.upstreams[0].signal(signal.SIGSTOP)

        async def resume() -> None:
            await asyncio.sleep(stop_s)
            rig.upstreams[0].signal(signal.SIGCONT)
        return asyncio.create_task(resume())
    elif fault != "none":
        rig.proxy.mode = fault
    return None


async def heal(fault: str, rig: Rig, resuming: asyncio.Task | None) -> None:
    """Undo the fault: a killed upstream restarts on its port, a stopped one continues."""
    rig.proxy.mode = "pass"
    if resuming is not None:
        await resuming
    if fault == "kill":
        rig.upstreams[0].proc.wait(20)
        await asyncio.to_thread(rig.upstreams[0].start)


async def run_fault(fault: str, rig: Rig, args: argparse.Namespace) -> dict:
    """One fault under a fresh load: the row of the table."""
    tally, budget_s = Tally(), args.request_timeout_s + HANG_SLACK_S
    order = iter(range(args.requests))
    state: dict = {"finished": 0, "resuming": None, "injected": False}
    async with aiohttp.ClientSession() as session:
        retried_before = await router_sum(session, rig.url, "servelab_router_retries_total{")

        async def worker() -> None:
            for i in order:
                await one_request(session, rig.url, i, args.max_tokens, budget_s, tally)
                state["finished"] += 1
                if not state["injected"] and state["finished"] >= args.requests // 4:
                    state["injected"] = True
                    state["resuming"] = await inject(fault, rig, args.stop_s)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        rss_mib = rig.router.rss_mib()
        await heal(fault, rig, state["resuming"])
        retried = await router_sum(session, rig.url, "servelab_router_retries_total{")
        await until_all_healthy(session, rig.url, 120.0)
    completed = f"{tally.completed - tally.completed_streamed}+{tally.completed_streamed}"
    return {"fault": fault, "sent": tally.sent, "completed": completed,
            "retried": int(retried - retried_before), "failed_before": tally.failed_before,
            "failed_mid_stream": tally.failed_mid_stream, "lost": tally.lost,
            "duplicates": tally.duplicates, "hung": tally.hung,
            "max_latency_s": round(max(tally.latencies_s), 2), "router_rss_mib": round(rss_mib),
            "errors": sorted(tally.errors)}


async def start_rig(kinds: list[str], args: argparse.Namespace, out: Path) -> Rig:
    ports = [free_port() for _ in kinds]
    upstreams = [upstream_process(kind, port, out / f"upstream{i}-{kind}.log")
                 for i, (kind, port) in enumerate(zip(kinds, ports, strict=True))]
    await asyncio.gather(*(asyncio.to_thread(u.start) for u in upstreams))
    proxy = FaultProxy(ports[-1])
    await proxy.start()
    urls = [f"http://127.0.0.1:{p}" for p in ports[:-1]] + [f"http://127.0.0.1:{proxy.port}"]
    port = free_port()
    router = Process(["route", "--upstream", ",".join(urls), "--router", "least-requests",
                      "--port", str(port), "--request-timeout-s", str(args.request_timeout_s),
                      *args.route_flags.split()], out / "router.log")
    await asyncio.to_thread(router.start)
    return Rig(upstreams, proxy, router, f"http://127.0.0.1:{port}")


# completed: "plain+streamed" (sent: half each, the odd ones streamed)
COLUMNS = ("fault", "sent", "completed", "retried", "failed_before", "failed_mid_stream",
           "lost", "duplicates", "hung", "max_latency_s", "router_rss_mib")


def print_table(rows: list[dict]) -> None:
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in COLUMNS) + " |", flush=True)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


async def main_async(args: argparse.Namespace, out: Path) -> list[dict]:
    kinds = args.upstreams.split(",")
    faults = args.faults.split(",")
    unknown = [k for k in kinds if k not in ("tiny", "simulated")] + \
        [f for f in faults if f not in FAULTS]
    if unknown or len(kinds) < 2:
        raise SystemExit(f"faults: need two or more upstreams; unknown: {unknown}")
    rig = await start_rig(kinds, args, out)
    rows: list[dict] = []
    try:
        print(f"{cpu_name()}, {os.cpu_count()} CPUs; upstreams {','.join(kinds)} (the last "
              f"behind the fault proxy); {args.requests} requests a fault, {args.concurrency} "
              f"at a time, odd ones streamed; logs in {out}", flush=True)
        for fault in faults:
            rows.append(await run_fault(fault, rig, args))
            print(f"  {fault}: {rows[-1]}", file=sys.stderr, flush=True)
    finally:
        for process in (rig.router, *rig.upstreams):
            await asyncio.to_thread(process.stop)
    return rows


def main() -> None:
    args = parse_args()
    out = Path(tempfile.mkdtemp(prefix="servelab-faults-"))
    rows = asyncio.run(main_async(args, out))
    print_table(rows)
    if args.json is not None:
        args.json.write_text(json.dumps({"cpu": cpu_name(), "args": vars(args) | {
            "json": str(args.json)}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
