"""A scripted streaming server for the load client's tests: plain HTTP/1.1 over asyncio on a
loopback port, on its own thread, that can close connections where a real server might."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

VOCAB_SIZE = 64


@dataclass
class Script:
    """How the server treats requests. A request is named by its max_tokens."""

    # A connection idle this long is closed as the next request on it arrives, unanswered:
    # the moment a server's idle timer fires as a client writes on the connection, every time.
    keepalive_s: float | None = None
    drop_after_headers: set[int] = field(default_factory=set)  # close once the headers are out
    drop_after_a_chunk: set[int] = field(default_factory=set)  # ... once one token is out
    drop_unanswered: set[int] = field(default_factory=set)  # close having read the request
    keep_alive: bool = True  # False: every answer says `connection: close` and closes


class ScriptedServer:
    """Serves /v1/models and streamed /v1/completions (one token per event); `seen` counts
    the completions each max_tokens got (read, whatever happened next), `closed_idle` by path
    the requests refused as the idle timeout's."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.seen: Counter[int] = Counter()
        self.closed_idle: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scripted-server", daemon=True)
        self.url = ""

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        if not self._ready.wait(30.0):
            raise RuntimeError("the scripted server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10.0)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        idle_since = None  # when the last response on this connection ended
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in
                           (line.split(":", 1) for line in lines[1:] if ":" in line)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                keepalive = self.script.keepalive_s
                if idle_since is not None and keepalive is not None \
                        and time.monotonic() - idle_since > keepalive:
                    self.closed_idle[path] += 1
                    return
                if not await self._answer(method, path, body, writer) \
                        or not self.script.keep_alive:
                    return
                idle_since = time.monotonic()
        finally:
            writer.transport.abort()

    async def _answer(self, method: str, path: str, body: bytes,
                      writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False where the script closes the connection instead."""
        if method == "GET" and path == "/v1/models":
            card = {"id": "scripted", "max_model_len": 256, "vocab_size": VOCAB_SIZE}
            _send_json(writer, 200, {"object": "list", "data": [card]}, self._connection_header())
        elif method == "POST" and path == "/v1/completions":
            return await self._complete(json.loads(body), writer)
        else:
            _send_json(writer, 404, {"error": {"message": f"no {method} {path}"}},
                       self._connection_header())
        await writer.drain()
        return True

    def _connection_header(self) -> bytes:
        return b"" if self.script.keep_alive else b"connection: close\r\n"

    async def _complete(self, request: dict, writer: asyncio.StreamWriter) -> bool:
        n = request["max_tokens"]
        self.seen[n] += 1
        if n in self.script.drop_unanswered:
            return False
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n" + self._connection_header() + b"\r\n")
        await writer.drain()
        if n in self.script.drop_after_headers:
            return False
        for i in range(n):
            done = "length" if i == n - 1 else None
            event = {"choices": [{"index": 0, "text": "x", "token_ids": [5],
                                  "finish_reason": done}]}
            _send_chunk(writer, b"data: " + json.dumps(event).encode() + b"\n\n")
            await writer.drain()
            if n in self.script.drop_after_a_chunk:
                return False
        _send_chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


def _send_json(writer: asyncio.StreamWriter, status: int, payload: dict,
               extra_headers: bytes) -> None:
    data = json.dumps(payload).encode()
    writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(data)}\r\n".encode() + extra_headers + b"\r\n" + data)


def _send_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
