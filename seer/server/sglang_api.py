"""SGLang-style ``/generate``, as slime and verl's SGLang rollout call it.

Shape as SGLang returns it: one prompt with ``n`` = 1 gives one object ``{"text", "output_ids", "meta_info"}``;
a batch of prompts, or ``n`` > 1, gives a list (prompt-major: prompt i's samples at i*n ... i*n+n-1).
``meta_info`` has ``id``, ``finish_reason`` (``{"type": "stop", "matched": ...}``, ``{"type": "length",
"length": n}`` or ``{"type": "abort", ...}``), ``prompt_tokens``, ``completion_tokens``, ``weight_version``,
and with ``return_logprob`` the ``output_token_logprobs`` as ``[logprob, token_id, null]`` triples. With
``stream: true`` each SSE event is one sample's state so far (cumulative text and ids, SGLang's default), then
``data: [DONE]``.
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
from seer.server.protocol import APIError, GenerateRequest, parse_json, validate
from seer.server.state import ServerState, server_state

router = APIRouter()


def _ids(req: GenerateRequest, count: int) -> list[str]:
    if isinstance(req.rid, list) and len(req.rid) == count:
        return list(req.rid)
    base = req.rid if isinstance(req.rid, str) else uuid.uuid4().hex
    return [base] if count == 1 else [f"{base}-{i}" for i in range(count)]


def _item(coll: Collector, st: ServerState, req: GenerateRequest, rids: list[str], p: int, j: int) -> dict[str, Any]:
    s = coll.samples[p][j]
    return render.sglang_item(rids[coll.choice_index(p, j)], s, len(coll.prepared.parts[p].prompt_token_ids),
                              req.return_logprob, coll.weight_version, round(time.monotonic() - coll.t0, 4))


@router.post("/generate")
async def generate(request: Request) -> Any:
    st = server_state(request)
    req = validate(GenerateRequest, parse_json(await request.body()))
    prepared = st.converter.generate(req)
    rids = _ids(req, prepared.num_samples)
    single = len(prepared.parts) == 1 and prepared.num_samples == 1
    if req.stream:
        return StreamingResponse(_stream(request, st, req, prepared, rids), media_type="text/event-stream")
    async with serving(request.receive, st.batcher, st.tokenizer, prepared) as coll:
        await coll.wait()
    items = [_item(coll, st, req, rids, p, j) for p, part in enumerate(coll.samples) for j in range(len(part))]
    return JSONResponse(items[0] if single else items)


async def _stream(request: Request, st: ServerState, req: GenerateRequest, prepared: Any,
                  rids: list[str]) -> AsyncIterator[str]:
    try:
        async with serving(request.receive, st.batcher, st.tokenizer, prepared, stream=True) as coll:
            async for changed in coll.updates():
                for p, j in sorted(changed):
                    item = _item(coll, st, req, rids, p, j)
                    item["index"] = coll.choice_index(p, j)
                    yield render.sse(item)
    except APIError as err:
        yield render.sse({"error": err.body()["error"]})
    yield render.sse("[DONE]")
