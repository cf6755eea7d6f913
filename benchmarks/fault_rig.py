"""The fault rig of benchmarks/faults.py: upstream server processes it can kill or stop, and a
proxy in front of one that answers 500, garbage, stalls mid-body or resets its connections."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Process:
    """A servelab subprocess in its own process group, listening on a port chosen here."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.argv, self.log = argv, log
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 180.0) -> None:
        """Launch it; return once it prints that it listens (again, after a restart)."""
        starts = self._listening() + 1
        with self.log.open("a") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "servelab", *self.argv],
                                         cwd=ROOT, stdout=log, stderr=log,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while self._listening() < starts:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"servelab {' '.join(self.argv)} did not start: {self.log}")
            time.sleep(0.2)

    def _listening(self) -> int:
        return self.log.read_text().count("listening on") if self.log.exists() else 0

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(20)
        self.log.write_text(self.log.read_text() + "\n--- stopped ---\n")


def upstream_process(kind: str, port: int, log: Path) -> Process:
    model = ["--model", "tiny"] if kind == "tiny" else ["--simulate"]
    return Process(["serve", *model, "--port", str(port)], log)


class FaultProxy:
    """One request per connection to `backend_port`, as `mode` says: pass, http500, garbage,
    stall (forward the response's first bytes, then nothing) or reset (an RST after a few
    bytes of the response: none, mid-head or mid-body, in turn). Only POSTs are harmed, so
    health checks and /metrics see a live server, as with a sick model behind a live API."""

    def __init__(self, backend_port: int) -> None:
        self.backend_port, self.mode, self.port, self._resets = backend_port, "pass", 0, 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            body = await reader.readexactly(length)
            mode = self.mode if head.startswith(b"POST") else "pass"
            await self._serve(mode, head, body, reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _serve(self, mode: str, head: bytes, body: bytes, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        if mode == "http500":
            error = b'{"error": {"message": "injected 500", "type": "server_error"}}'
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: "
                         b"application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(error), error))
            return await writer.drain()
        if mode == "garbage":
            writer.write(b"\x00\xffthis is not HTTP\r\n\r\n")
            return await writer.drain()
        lines = [x for x in head.split(b"\r\n") if not x.lower().startswith(b"connection:")]
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.backend_port)
        try:
            up_writer.write(b"\r\n".join(lines[:-2] + [b"Connection: close", b"", b""]) + body)
            limit = {"stall": 200, "reset": (0, 60, 300)[self._resets % 3]}.get(mode)
            self._resets += mode == "reset"
            await self._pipe(up_reader, writer, limit)
            if mode == "stall":  # hold the connection until the router gives up on it
                await asyncio.wait_for(reader.read(), 600)
            elif mode == "reset":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
        finally:
            up_writer.close()

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                    limit: int | None) -> None:
        """Forward until the end, or until `limit` bytes are through."""
        sent = 0
        while limit is None or sent < limit:
            data = await source.read(65536 if limit is None else limit - sent)
            if not data:
                return
            sink.write(data)
            await sink.drain()
            sent += len(data)
