"""The FastAPI app: routes, OpenAI-style errors, and the small endpoints (health, models, metrics, weights).

``create_app(coordinator, config)`` wraps an existing ``RolloutCoordinator``; the app starts the batcher's
worker thread on startup and fails every pending request with a 503 on shutdown. Every error a client can
cause is answered as ``{"error": {"message", "type", "param", "code"}}``: 400 for bad input (invalid JSON,
unknown model, bad sampling values, a prompt or ``max_tokens`` beyond the context), 401 for a missing or wrong
API key, 404/405 for unknown routes, 413 for an oversized body; 500/503 for the server's own failures.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from seer.server import openai_api, rollout_api, sglang_api
from seer.server.config import ServerConfig
from seer.server.metrics import CONTENT_TYPE
from seer.server.protocol import APIError, UpdateWeightsRequest, error_body, parse_json, validate
from seer.server.security import Guard
from seer.server.state import ServerState, server_state

log = logging.getLogger("seer.server")

KNOWN_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models", "/generate", "/v1/rollout",
                         "/update_weights", "/update_weights_from_disk", "/health", "/metrics", "/get_model_info"})
_misc = APIRouter()


def create_app(coordinator: Any, config: ServerConfig) -> FastAPI:
    state = ServerState.build(coordinator, config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.batcher.start()
        yield
        state.batcher.shutdown()

    app = FastAPI(title="Seer rollout server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.seer = state
    app.include_router(openai_api.router)
    app.include_router(sglang_api.router)
    app.include_router(rollout_api.router)
    app.include_router(_misc)

    def on_status(path: str, status: int) -> None:
        state.metrics.on_request(path if path in KNOWN_PATHS else "other", status)

    app.add_middleware(Guard, api_key=config.api_key, max_body_bytes=config.max_body_bytes,
                       on_status=on_status)

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(err.detail), kind), status_code=err.status_code,
                            headers=getattr(err, "headers", None))

    @app.exception_handler(Exception)
    async def server_error(request: Request, err: Exception) -> JSONResponse:
        log.exception("seer server: unhandled error")
        return JSONResponse(error_body(f"internal server error: {type(err).__name__}: {err}", "server_error"),
                            status_code=500)

    return app


@_misc.get("/health")
async def health(request: Request) -> dict[str, Any]:
    st = server_state(request)
    return {"status": "ok", "model": st.config.model_name, "weight_version": st.metrics.weight_version}


@_misc.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    st = server_state(request)
    return {"object": "list", "data": [{
        "id": st.config.model_name, "object": "model", "created": int(st.metrics.started), "owned_by": "seer",
        "root": str(st.coordinator.model), "max_model_len": st.limits.max_model_len}]}


@_misc.get("/get_model_info")
async def model_info(request: Request) -> dict[str, Any]:
    st = server_state(request)
    return {"model_path": str(st.coordinator.model), "tokenizer_path": str(st.coordinator.model),
            "is_generation": True, "weight_version": st.metrics.weight_version}


@_misc.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(server_state(request).metrics.render(), media_type=CONTENT_TYPE)


@_misc.post("/update_weights")
@_misc.post("/update_weights_from_disk")
async def update_weights(request: Request) -> dict[str, Any]:
    """Load weights from a safetensors directory once the running batch ends; returns the new version."""
    st = server_state(request)
    req = validate(UpdateWeightsRequest, parse_json(await request.body()))
    path = Path(req.model_path)
    if not path.is_dir() or not any(path.glob("*.safetensors")):
        raise APIError(f"'{req.model_path}' is not a directory of safetensors files", param="model_path")
    t0 = time.perf_counter()
    try:
        version = await st.batcher.update_weights(str(path), req.weight_version)
    except APIError:
        raise
    except (ValueError, KeyError, FileNotFoundError) as err:
        raise APIError(f"could not load weights from '{req.model_path}': {err}", param="model_path") from None
    return {"success": True, "weight_version": version, "message": f"loaded {path}",
            "seconds": round(time.perf_counter() - t0, 3)}
