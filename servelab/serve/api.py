"""The FastAPI app: OpenAI-compatible routes, health, metrics and OpenAI-style errors."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servelab.serve.chat import create_chat_completion, parse_chat
from servelab.serve.completions import create_completion
from servelab.serve.json_body import parse_json
from servelab.serve.metrics import CONTENT_TYPE
from servelab.serve.protocol import ApiError, error_body, parse_completion
from servelab.serve.state import ServeState

log = logging.getLogger(__name__)

# The body parser of each generation endpoint, the one its handler calls: `servelab route`
# checks a body with it too, so a body is refused the same way with or without the router.
BODY_PARSERS: dict[str, Callable[[dict[str, Any]], object]] = {
    "/v1/completions": parse_completion,
    "/v1/chat/completions": parse_chat,
}


def parse_body(path: str, raw: bytes) -> dict[str, Any]:
    """The JSON object of a body POSTed to `path`; ApiError (400, naming the field) where the
    server's handler would refuse it before tokenizing."""
    data = parse_json(raw)
    BODY_PARSERS[path](data)
    return data


def build_app(state: ServeState) -> FastAPI:
    """The app over a started engine thread (the caller owns its life cycle)."""
    app = FastAPI(title="servelab", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    created = int(time.time())
    key = state.config.api_key.encode("utf-8") if state.config.api_key is not None else None

    def authorize(request: Request) -> None:
        check_bearer(request.headers.get("authorization", ""), key)

    @app.post("/v1/completions")
    async def completions(request: Request):
        authorize(request)
        return await create_completion(state, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        authorize(request)
        return await create_chat_completion(state, request)

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        authorize(request)
        card = {"id": state.config.model_name, "object": "model", "created": created,
                "owned_by": "servelab", "max_model_len": state.config.max_model_len,
                "vocab_size": state.vocab_size}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> JSONResponse:
        engine = state.engine
        status = ("dead" if not engine.is_alive else "draining" if engine.draining else "ok")
        body = {"status": status, **asdict(engine.stats)}
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    add_error_handlers(app)
    return app


def check_bearer(authorization: str, key: bytes | None) -> None:
    """401 unless the Authorization header is 'Bearer KEY' for the key's UTF-8 bytes (no
    key: everyone is let in)."""
    if key is None:
        return
    scheme, _, token = authorization.partition(" ")
    # Starlette decodes header bytes as latin-1, so encoding back gives the bytes sent
    # (UTF-8 for a non-ASCII key). Bytes also keep compare_digest from raising on a
    # non-ASCII str. Strip only HTTP's own whitespace: str.strip() would eat 0x85 and
    # 0xA0, which end some UTF-8 characters.
    given = token.strip(" \t").encode("latin-1")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given, key):
        raise ApiError(401, "missing or incorrect API key; send 'Authorization: Bearer KEY'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def add_error_handlers(app: FastAPI) -> None:
    app.add_middleware(_InternalErrors)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        body = error_body(str(exc.detail), kind, code=str(exc.status_code))
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


class _InternalErrors:
    """ASGI middleware: an unexpected exception becomes a JSON 500 on a connection kept open."""

    # Starlette's handler for Exception sends its 500 and then re-raises, and uvicorn closes
    # a connection whose app raised, without `Connection: close`: a pooling client's next
    # request on it then fails. Handled here, inside that layer, the exception ends at us.
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            if started:  # mid-response: only closing the connection can tell the client
                raise
            log.exception("unhandled error")
            body = error_body(f"internal error: {type(exc).__name__}", "server_error")
            await JSONResponse(body, status_code=500)(scope, receive, send)
