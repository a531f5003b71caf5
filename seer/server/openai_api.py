"""OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions``, whole or streamed (SSE).

The ``n`` samples of a prompt are one Seer group. Streaming is chunk-granular: tokens reach the server when a
rollout chunk ends (``ServerConfig.chunk_tokens`` tokens, 32 by default), so a stream advances in steps of up
to that many tokens per sample. Errors before the first byte are HTTP errors with OpenAI-style bodies; an
error after streaming started (the server shutting down, a failed batch) is sent as a ``data: {"error": ...}``
event, which the ``openai`` client raises as ``APIError``, followed by ``[DONE]``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from seer.server import render
from seer.server.collect import Collector, serving
from seer.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, parse_json, validate
from seer.server.state import ServerState, server_state

router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _stream_response(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


async def _guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Turn an error raised mid-stream into an SSE error event, then end the stream properly."""
    try:
        async for item in events:
            yield item
    except APIError as err:
        yield render.sse({"error": err.body()["error"]})
    yield render.sse("[DONE]")


# ---------------------------------------------------------------------------------------------- completions
@router.post("/v1/completions")
async def completions(request: Request) -> Any:
    st = server_state(request)
    req = validate(CompletionRequest, parse_json(await request.body()))
    prepared = st.converter.completion(req)
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    if req.stream:
        return _stream_response(_guarded(_stream_completion(request, st, req, prepared, rid, created)))
    async with serving(request.receive, st.batcher, st.tokenizer, prepared) as coll:
        await coll.wait()
    choices = []
    for p, part in enumerate(coll.samples):
        for j, s in enumerate(part):
            choices.append(render.completion_choice(coll.choice_index(p, j), s, s.text, s.token_ids, s.logprobs,
                                                    s.finish_reason, st.tokenizer, req.logprobs,
                                                    req.return_tokens_as_token_ids, req.return_token_ids))
    body: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created,
                            "model": st.config.model_name, "choices": choices,
                            "usage": render.usage(coll.prompt_tokens, coll.completion_tokens)}
    if req.return_token_ids:
        body["prompt_token_ids"] = [list(p.prompt_token_ids) for p in prepared.parts]
    return JSONResponse(body)


async def _stream_completion(request: Request, st: ServerState, req: CompletionRequest, prepared: Any, rid: str,
                             created: int) -> AsyncIterator[str]:
    model = st.config.model_name
    async with serving(request.receive, st.batcher, st.tokenizer, prepared, stream=True) as coll:
        offsets: dict[tuple[int, int], int] = {}
        async for changed in coll.updates():
            choices = []
            for p, j in sorted(changed):
                s = coll.samples[p][j]
                text, ids, lps = s.delta()
                if not text and not ids and not s.done:
                    continue
                off = offsets.get((p, j), 0)  # text_offset continues across chunks
                choices.append(render.completion_choice(coll.choice_index(p, j), s, text, ids, lps,
                                                        s.finish_reason if s.done else None, st.tokenizer,
                                                        req.logprobs, req.return_tokens_as_token_ids,
                                                        req.return_token_ids, off))
                if req.logprobs is not None:
                    offsets[(p, j)] = off + sum(len(render.token_text(st.tokenizer, t, req.return_tokens_as_token_ids))
                                                for t in ids)
            if choices:
                yield render.sse(render.completion_chunk(rid, created, model, choices))
        if req.stream_options is not None and req.stream_options.include_usage:
            yield render.sse(render.completion_chunk(rid, created, model, [],
                                                     render.usage(coll.prompt_tokens, coll.completion_tokens)))


# ---------------------------------------------------------------------------------------------- chat
@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Any:
    st = server_state(request)
    req = validate(ChatCompletionRequest, parse_json(await request.body()))
    prepared = st.converter.chat(req)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    top = req.top_logprobs or 0
    if req.stream:
        return _stream_response(_guarded(_stream_chat(request, st, req, prepared, rid, created)))
    async with serving(request.receive, st.batcher, st.tokenizer, prepared) as coll:
        await coll.wait()
    choices = [render.chat_choice(coll.choice_index(p, j), s, st.tokenizer, req.logprobs, top,
                                  req.return_tokens_as_token_ids, req.return_token_ids)
               for p, part in enumerate(coll.samples) for j, s in enumerate(part)]
    body: dict[str, Any] = {"id": rid, "object": "chat.completion", "created": created,
                            "model": st.config.model_name, "choices": choices,
                            "usage": render.usage(coll.prompt_tokens, coll.completion_tokens)}
    if req.return_token_ids:
        body["prompt_token_ids"] = list(prepared.parts[0].prompt_token_ids)
    return JSONResponse(body)


async def _stream_chat(request: Request, st: ServerState, req: ChatCompletionRequest, prepared: Any, rid: str,
                       created: int) -> AsyncIterator[str]:
    model, top = st.config.model_name, req.top_logprobs or 0
    async with serving(request.receive, st.batcher, st.tokenizer, prepared, stream=True) as coll:
        first = [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None} for i in range(prepared.num_samples)]
        yield render.sse(render.chat_chunk(rid, created, model, first))
        async for changed in coll.updates():
            choices = [c for p, j in sorted(changed) if (c := _chat_delta(coll, p, j, st, req, top)) is not None]
            if choices:
                yield render.sse(render.chat_chunk(rid, created, model, choices))
        if req.stream_options is not None and req.stream_options.include_usage:
            yield render.sse(render.chat_chunk(rid, created, model, [],
                                               render.usage(coll.prompt_tokens, coll.completion_tokens)))


def _chat_delta(coll: Collector, p: int, j: int, st: ServerState, req: ChatCompletionRequest,
                top: int) -> dict[str, Any] | None:
    s = coll.samples[p][j]
    text, ids, lps = s.delta()
    if not text and not ids and not s.done:
        return None
    choice: dict[str, Any] = {
        "index": coll.choice_index(p, j), "delta": {"content": text} if text or not s.done else {},
        "logprobs": render.chat_logprobs(st.tokenizer, ids, lps, top, req.return_tokens_as_token_ids)
        if req.logprobs else None,
        "finish_reason": s.finish_reason if s.done else None}
    if req.return_token_ids:
        choice["token_ids"] = list(ids)
    return choice
