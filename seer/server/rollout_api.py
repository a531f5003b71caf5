"""``/v1/rollout``: a whole batch of groups in one call, results streamed back as NDJSON as each group finishes.

Why a batch endpoint next to the OpenAI ones: context-aware scheduling works best when it sees the whole batch
at once (probes first, long groups early), and a synchronous RL trainer has the whole batch anyway. All groups
of one call run in the same rollout (they are never merged with other requests' samples), and each line is
written the moment its group's last response ends, so a trainer can start scoring early:

    {"group": i, "group_id": ..., "prompt_token_ids": [...], "weight_version": v, "metadata": {...},
     "responses": [{"index": j, "token_ids": [...], "logprobs": [...], "text": "...", "finish_reason": "..."}]}

then one closing line ``{"done": true, "groups": G, "responses": R, "prompt_tokens": P, "completion_tokens": C,
"weight_version": v}``. An error after the first line (e.g. shutdown) is a closing ``{"error": {...}}`` line.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from seer.server import render
from seer.server.collect import serving
from seer.server.protocol import APIError, RolloutRequest, parse_json, validate
from seer.server.state import ServerState, server_state

router = APIRouter()


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj) + "\n"


@router.post("/v1/rollout")
async def rollout(request: Request) -> Any:
    st = server_state(request)
    req = validate(RolloutRequest, parse_json(await request.body()))
    prepared = st.converter.rollout(req)
    return StreamingResponse(_lines(request, st, req, prepared), media_type="application/x-ndjson")


async def _lines(request: Request, st: ServerState, req: RolloutRequest, prepared: Any) -> AsyncIterator[str]:
    sent: set[int] = set()
    try:
        async with serving(request.receive, st.batcher, st.tokenizer, prepared) as coll:
            async for changed in coll.updates():
                for p in sorted({p for p, _ in changed}):
                    if p in sent or not coll.part_done(p):
                        continue
                    sent.add(p)
                    part = prepared.parts[p]
                    yield _line(render.rollout_line(p, part.group_id, part.prompt_token_ids, coll.samples[p],
                                                    coll.weight_version, part.metadata, req.return_text))
        yield _line({"done": True, "groups": len(prepared.parts), "responses": prepared.num_samples,
                     "prompt_tokens": coll.prompt_tokens, "completion_tokens": coll.completion_tokens,
                     "weight_version": coll.weight_version})
    except APIError as err:
        yield _line(err.body())
