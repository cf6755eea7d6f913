"""`servelab serve` as a process: SIGKILL keeps every finished request's log row, a restart
appends to the log, SIGTERM drains (503 for newcomers, in-flight requests finish or are
aborted after the drain timeout) and exits 0.

A test whose outcome needs a request still in flight serves --simulate: each step takes the
cost model's set duration (milliseconds), however fast the CPU, so a request of thousands
of tokens is in flight for many seconds, and a short one is done in a fraction of one."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.servelab.serve.helpers import HANG_S, async_client

REPO = Path(__file__).resolve().parents[3]
# The real executor, its steps as fast as the CPU.
TINY = ("--model", "tiny", "--threads", "1", "--num-blocks", "1024")
# llama-3-8b on an h100: a decode step takes a set ~7 ms. A KV pool that holds many long
# requests whole (the scheduler admits one only while its full length fits).
SIMULATED = ("--simulate", "--num-blocks", "16384")


class ServeProcess:
    """`python -m servelab serve` on a free port; stderr drained by a thread."""

    def __init__(self, log: Path, *extra: str, backend: tuple[str, ...] = TINY) -> None:
        cmd = [sys.executable, "-m", "servelab", "serve", *backend, "--port", "0",
               "--request-log", str(log), *extra]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._url = threading.Event()
        self.url = ""
        threading.Thread(target=self._read, daemon=True).start()
        if not self._url.wait(300):  # stops a hung test only: a first run builds the kernels
            self.proc.kill()
            raise AssertionError("server did not start:\n" + "".join(self.lines))

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            if "listening on " in line and not self.url:
                self.url = line.rsplit("listening on ", 1)[1].strip()
                self._url.set()


@pytest.fixture
def launch() -> Iterator[Callable[..., ServeProcess]]:
    """Start servers; whatever is still running at teardown is killed (a failed test too)."""
    started: list[ServeProcess] = []

    def start(log: Path, *extra: str, backend: tuple[str, ...] = TINY) -> ServeProcess:
        started.append(ServeProcess(log, *extra, backend=backend))
        return started[-1]

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(10)


async def stream(client: httpx.AsyncClient, body: dict, first_token: asyncio.Event | None = None):
    """(request id, finish_reason or None if cut off) of one streamed completion."""
    rid, finish = None, None
    try:
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                rid = chunk["id"]
                if first_token is not None:
                    first_token.set()
                finish = chunk["choices"][0]["finish_reason"] or finish
    except httpx.HTTPError:
        return rid, None
    finally:
        if first_token is not None:
            first_token.set()  # also on failure: the caller's wait must end
    return rid, finish


def logged(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT request_id, finish_reason FROM requests"))


def test_sigkill_keeps_finished_rows_and_restart_appends(tmp_path, launch):
    log = tmp_path / "requests.sqlite"
    server = launch(log, backend=SIMULATED)  # the long ones take ~30 s of set step times
    short = [{"prompt": [5 + i] * 6, "max_tokens": 2 + i, "ignore_eos": True} for i in range(6)]
    long = [{"prompt": [9] * 6, "max_tokens": 4000, "ignore_eos": True} for _ in range(4)]

    async def main():
        async with async_client(server.url) as client:
            cut = [asyncio.create_task(stream(client, b)) for b in long]
            done = await asyncio.gather(*(stream(client, b) for b in short))
            server.proc.send_signal(signal.SIGKILL)  # mid-run: the long ones are in flight
            return done, await asyncio.gather(*cut)

    done, cut = asyncio.run(main())
    assert server.proc.wait(10) == -signal.SIGKILL
    assert all(finish == "length" for _, finish in done)
    assert any(finish is None for _, finish in cut)
    rows = logged(log)
    for rid, _ in done:
        assert rows[rid] == "length"
    restarted = launch(log)  # on the real model: a restart appends whatever it serves
    response = httpx.post(f"{restarted.url}/v1/completions", json=short[0], trust_env=False,
                          timeout=HANG_S)
    assert response.status_code == 200
    restarted.proc.send_signal(signal.SIGTERM)
    assert restarted.proc.wait(30) == 0
    after = logged(log)
    assert len(after) == len(rows) + 1 and after[response.json()["id"]] == "length"


def test_sigterm_drains_refuses_newcomers_and_aborts_after_timeout(tmp_path, launch):
    log = tmp_path / "requests.sqlite"
    # Set step times of ~7 ms: the quick one needs under 0.3 s more, the endless one over
    # 50 s, on either side of the 3 s drain timeout on any CPU.
    server = launch(log, "--drain-timeout-s", "3", backend=SIMULATED)
    quick = {"prompt": [7] * 6, "max_tokens": 30, "ignore_eos": True}
    endless = {"prompt": [8] * 6, "max_tokens": 8000, "ignore_eos": True}

    async def main():
        async with async_client(server.url) as client:
            started = asyncio.Event(), asyncio.Event()
            tasks = [asyncio.create_task(stream(client, endless, started[0])),
                     asyncio.create_task(stream(client, quick, started[1]))]
            await asyncio.wait_for(asyncio.gather(started[0].wait(), started[1].wait()), 30)
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            refused = None
            while refused is None and time.monotonic() - t0 < 30:  # stops a hung test only
                response = await client.post("/v1/completions", json=quick)
                refused = response if response.status_code == 503 else None
            health = await client.get("/health")
            return await asyncio.gather(*tasks), refused, health

    (aborted, finished), refused, health = asyncio.run(main())
    assert refused is not None and refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["code"] == "draining"
    assert health.status_code == 503 and health.json()["status"] == "draining"
    assert finished[1] == "length"  # in flight, short: drained normally
    assert aborted[1] == "abort"  # in flight past the drain timeout: aborted
    assert server.proc.wait(30) == 0
    rows = logged(log)
    assert rows[finished[0]] == "length" and rows[aborted[0]] == "aborted"
    assert "draining" in rows.values()
