"""Where a request's time goes in `servelab serve --simulate`, outside the simulated step.

Runs a simulated Llama-3-8B / A100-80GB server in this process (uvicorn on a thread, the
engine thread beside it) and the load client (servelab.bench.client.run_bench, bench-serve's code)
in
a child process, so the two do not share an interpreter. By default the client sends lone
streamed requests of `--prompt-len` token ids, spaced so each finds the server idle;
`--trace SPEC` replays a trace instead (sessions closed-loop, as bench-serve does). Each
request is stamped on the machine's monotonic clock at every hand-off:

    sent       the client stamps the request sent, its body encoded (its TTFT starts here)
    handler    the server's handler starts (headers read, routed: the request's arrival_s)
    parsed     the body read and parsed as JSON, the prompt's ids checked
    queued     handed to the engine thread's inbox
    applied    the engine thread took it from the inbox into the scheduler
    step       the step that prefills it is scheduled (first_scheduled_s)
    token      that step ended: the first token exists (token_times_s[0])
    posted     the engine thread handed the token to the event loop (call_soon_threadsafe)
    loop       the event loop ran that hand-off
    written    the first SSE chunk with text handed to uvicorn
    received   the client read that chunk

and prints the median and p95 of each gap, and the client's TTFT against the server's own
(handler -> token): what a simulator that prices only steps leaves out. Client and server
records are paired by their prompts. The stamps come from wrapping functions here; nothing
in serve/ is changed.
Run: python benchmarks/speed/serve_request_path.py [--requests 60] [--prompt-len 2000] [--trace T]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import uvicorn

import servelab.bench.client as client
import servelab.serve.completions as completions
import servelab.serve.engine_thread as engine_thread
import servelab.serve.handoff as handoff
from servelab.bench.client import BenchConfig, BenchRequest, bench_requests, run_bench
from servelab.serve.api import build_app
from servelab.serve.engine_thread import EngineThread, EngineThreadConfig
from servelab.serve.server import assemble, bind
from servelab.serve.simulated import SimulatedBackend, round_trip_token_ids
from servelab.serve.state import ApiConfig
from servelab.serve.tokenize_api import add_tokenize_routes
from servelab.serve.tokenizer import ByteTokenizer
from sim.deployment import DeploymentOptions, build_deployment
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from workloads import open_trace

GAPS = (("sent", "handler"), ("handler", "parsed"), ("parsed", "queued"),
        ("queued", "applied"), ("applied", "step"), ("step", "token"), ("token", "posted"),
        ("posted", "loop"), ("loop", "written"), ("written", "received"))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--prompt-len", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--gap-s", type=float, default=0.25, help="between lone requests")
    parser.add_argument("--trace", default=None, help="replay this trace instead")
    parser.add_argument("--switch-interval-s", type=float, default=None,
                        help="the server's sys.setswitchinterval (default: Python's, 0.005)")
    parser.add_argument("--client", default=None, help=argparse.SUPPRESS)  # the child: URL
    parser.add_argument("--stamps", type=Path, default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def prompt_key(ids: list[int]) -> str:
    """Pairs a client record with the server's: the prompt itself (hashes of int tuples
    are the same in every process)."""
    return f"{len(ids)}:{hash(tuple(ids))}"


class Stamps:
    """Monotonic stamps per request id (the server's), from any thread."""

    def __init__(self) -> None:
        self.at: dict[str, dict[str, float]] = defaultdict(dict)
        self.requests: dict[str, object] = {}  # request id -> the scheduler's Request

    def put(self, rid: str, name: str, at: float | None = None) -> None:
        self.at[rid].setdefault(name, time.monotonic() if at is None else at)


def instrument_server(stamps: Stamps, engine: EngineThread) -> None:
    """Wrap the server's hand-offs so each stamps the request passing through."""
    clock_t0 = engine.clock._t0  # the engine clock's zero on time.monotonic
    start, build, apply = (completions.start_generation, completions.build_request,
                           engine._apply)

    def build_request(state, body, prompt, default_max_tokens, arrival_s, tenant):
        request = build(state, body, prompt, default_max_tokens, arrival_s, tenant)
        stamps.put(request.request_id, "parsed")
        stamps.put(request.request_id, "handler", clock_t0 + arrival_s)
        return request

    def start_generation(state, http, body, prompt, default_max_tokens, arrival_s):
        gen = start(state, http, body, prompt, default_max_tokens, arrival_s)
        stamps.put(gen.request.request_id, "queued")
        stamps.requests[gen.request.request_id] = gen.request
        return gen

    def applied(ops):
        now = time.monotonic()
        apply(ops)
        for op in ops:
            if op[0] == "add":
                stamps.put(op[1].request.request_id, "applied", now)

    completions.start_generation = start_generation
    completions.build_request = build_request
    engine._apply = applied
    instrument_handoff(stamps, engine)


def instrument_handoff(stamps: Stamps, engine: EngineThread) -> None:
    """Wrap the engine thread's hand-off of tokens to the event loop: stamp a request's
    first token when it is posted and when the loop runs the post."""
    post, put_all, submit = engine_thread.post_events, handoff._put_all, engine.submit
    sinks: dict[int, str] = {}  # id(sink) -> request id, for requests without a token yet

    def post_events(events):
        now = time.monotonic()
        for sink, _ in events:
            rid = sinks.pop(id(sink), None)
            if rid is not None:
                stamps.put(rid, "posted", now)
                firsts[id(sink.queue)] = rid
        post(events)

    firsts: dict[int, str] = {}  # id(queue) -> request id, first tokens posted

    def put_all_stamped(items):
        now = time.monotonic()
        for queue, _ in items:
            rid = firsts.pop(id(queue), None)
            if rid is not None:
                stamps.put(rid, "loop", now)
        put_all(items)

    def submitted(request, sink, tenant=None):
        sinks[id(sink)] = request.request_id
        submit(request, sink, tenant)

    engine.submit = submitted
    engine_thread.post_events = post_events
    handoff._put_all = put_all_stamped


class FirstWrite:
    """ASGI middleware: stamps the first body chunk of each completion that carries text."""

    def __init__(self, app, stamps: Stamps) -> None:
        self.app, self.stamps = app, stamps

    async def __call__(self, scope, receive, send) -> None:
        seen = [False]

        async def watch(message) -> None:
            body = message.get("body", b"")
            if not seen[0] and b'"text":"x' in body:
                seen[0] = True
                self.stamps.put(body.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode(),
                                "written")
            await send(message)

        await self.app(scope, receive, watch)


def start_server(stamps: Stamps) -> tuple[str, uvicorn.Server, EngineThread]:
    """The instrumented simulated server on a free port: its URL, uvicorn, the engine."""
    deployment = build_deployment(DeploymentOptions(model="llama-3-8b", hardware="a100-80gb"))
    tokenizer = ByteTokenizer()
    config = SchedulerConfig(num_blocks=deployment.kv_pool.num_blocks,
                             max_model_len=deployment.max_model_len)
    backend = SimulatedBackend(deployment.cost_model, round_trip_token_ids(tokenizer))
    state = assemble(Scheduler(config), backend, tokenizer, tokenizer.vocab_size,
                     ApiConfig("llama-3-8b", config.max_model_len), EngineThreadConfig())
    instrument_server(stamps, state.engine)
    app = FirstWrite(add_tokenize_routes(build_app(state), state), stamps)
    sock = bind("127.0.0.1", 0)
    host, port = sock.getsockname()[:2]
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", access_log=False, http="h11",
                                          ws="none", loop="asyncio", log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    state.engine.start()
    while not server.started:
        time.sleep(0.01)
    return f"http://{host}:{port}", server, state.engine


def run_client(args: argparse.Namespace) -> None:
    """The child: send the requests with bench-serve's code, write each one's sent and
    received stamps by prompt key."""
    sent: dict[int, float] = {}  # id(record) -> when it was sent
    post, take = client._post, client._take_chunk

    async def stamped_post(run, request, record):
        await post(run, request, record)
        # The client's own stamp (perf_counter, the monotonic clock on Linux): TTFT's start.
        sent[id(record)] = run.t0 + record.arrival_s

    received: dict[int, float] = {}

    def take_chunk(record, data, now, errors):
        received.setdefault(id(record), time.monotonic())
        return take(record, data, now, errors)

    client._post, client._take_chunk = stamped_post, take_chunk
    if args.trace is not None:
        requests = bench_requests(open_trace(args.trace), ByteTokenizer().vocab_size)
    else:
        requests = [BenchRequest(f"r{i}", i * args.gap_s,
                                 [(7 * i + 13 * k) % 250 + 3 for k in range(args.prompt_len)],
                                 args.max_tokens) for i in range(args.requests)]
    result = asyncio.run(run_bench(requests, BenchConfig(args.client, timeout_s=3600)))
    assert not result.errors, result.errors[:3]
    rows = {prompt_key(r.prompt_token_ids): {"sent": sent[id(r)], "received": received[id(r)]}
            for r in result.requests}
    args.stamps.write_text(json.dumps(rows))


def main() -> None:
    args = parse_args()
    if args.client is not None:
        run_client(args)
        return
    stamps = Stamps()
    if args.switch_interval_s is not None:
        sys.setswitchinterval(args.switch_interval_s)
    url, server, engine = start_server(stamps)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "client.json"
        child = [a for a in sys.argv[1:]]
        subprocess.run([sys.executable, __file__, *child, "--client", url, "--stamps", str(out)],
                       check=True)
        sides = json.loads(out.read_text())
    server.should_exit = True
    engine.stop()
    rows = []
    for rid, request in stamps.requests.items():
        at = stamps.at[rid]
        at["step"] = engine.clock._t0 + request.first_scheduled_s
        at["token"] = engine.clock._t0 + request.token_times_s[0]
        at.update(sides[prompt_key(request.prompt_token_ids)])
        rows.append(at)
    report(rows[5:] if args.trace is None else rows, args)


def report(rows: list[dict[str, float]], args: argparse.Namespace) -> None:
    """Median and p95 of each gap, and the client's TTFT against the server's."""
    what = (f"trace {args.trace}" if args.trace else
            f"lone requests of {args.prompt_len} prompt token ids on an idle server")
    print(f"{len(rows)} requests ({what}); each gap in ms, median and p95:")

    def pct(values: list[float], q: float) -> float:
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))] * 1e3

    for a, b in GAPS:
        gaps = [r[b] - r[a] for r in rows]
        print(f"  {a:>8} -> {b:<8} {pct(gaps, 0.5):8.2f} {pct(gaps, 0.95):8.2f}")
    client_ttft = [r["received"] - r["sent"] for r in rows]
    server_ttft = [r["token"] - r["handler"] for r in rows]
    outside = [c - s for c, s in zip(client_ttft, server_ttft, strict=True)]
    print(f"TTFT median / p95: client {pct(client_ttft, 0.5):.2f} / {pct(client_ttft, 0.95):.2f}"
          f" ms, server (handler -> token) {pct(server_ttft, 0.5):.2f} / "
          f"{pct(server_ttft, 0.95):.2f} ms; per request, client less server: median "
          f"{pct(outside, 0.5):.2f} ms, p95 {pct(outside, 0.95):.2f}")


if __name__ == "__main__":
    main()
