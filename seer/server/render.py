"""Response bodies in the shapes clients parse: OpenAI completions and chat (whole and streamed chunks), SGLang
``/generate`` items, ``/v1/rollout`` lines.

Why kept apart from the routes: the shapes are what frameworks depend on (the ``openai`` client's models,
slime/verl reading ``meta_info``), so they live in one place, built from the same per-sample state
(``SampleText``) whatever the endpoint. Logprobs are those of the sampled tokens (the engine computes no
alternatives), so ``top_logprobs`` lists the sampled token only.
"""

from __future__ import annotations

import json
from typing import Any

from seer.models.tokenizer import Tokenizer
from seer.server.sequences import SampleText


def token_text(tokenizer: Tokenizer, token_id: int, as_id: bool = False) -> str:
    return f"token_id:{token_id}" if as_id else tokenizer.decode([token_id], skip_special_tokens=False)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_logprobs(tokenizer: Tokenizer, ids: list[int], lps: list[float], top: int, as_ids: bool,
                        offset: int = 0) -> dict[str, Any]:
    tokens = [token_text(tokenizer, t, as_ids) for t in ids]
    offsets = []
    for tok in tokens:
        offsets.append(offset)
        offset += len(tok)
    return {"tokens": tokens, "token_logprobs": list(lps),
            "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, lps)] if top > 0 else None,
            "text_offset": offsets}


def chat_logprobs(tokenizer: Tokenizer, ids: list[int], lps: list[float], top: int,
                  as_ids: bool) -> dict[str, Any]:
    content = []
    for t, lp in zip(ids, lps):
        tok = token_text(tokenizer, t, as_ids)
        entry = {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8"))}
        content.append({**entry, "top_logprobs": [entry] if top > 0 else []})
    return {"content": content}


def completion_choice(index: int, s: SampleText, text: str, ids: list[int], lps: list[float],
                      finish_reason: str | None, tokenizer: Tokenizer, logprobs: int | None, as_ids: bool,
                      return_ids: bool, offset: int = 0) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "text": text, "finish_reason": finish_reason, "stop_reason": None,
                              "logprobs": None if logprobs is None else
                              completion_logprobs(tokenizer, ids, lps, logprobs, as_ids, offset)}
    if finish_reason == "stop" and s.matched_stop is not None:
        choice["stop_reason"] = s.matched_stop
    if return_ids:
        choice["token_ids"] = list(ids)
    return choice


def chat_choice(index: int, s: SampleText, tokenizer: Tokenizer, logprobs: bool, top: int, as_ids: bool,
                return_ids: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": index, "message": {"role": "assistant", "content": s.text},
        "logprobs": chat_logprobs(tokenizer, s.token_ids, s.logprobs, top, as_ids) if logprobs else None,
        "finish_reason": s.finish_reason, "stop_reason": s.matched_stop}
    if return_ids:
        choice["token_ids"] = list(s.token_ids)
    return choice


def chat_chunk(rid: str, created: int, model: str, choices: list[dict[str, Any]],
               usage_: dict[str, int] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                            "choices": choices}
    if usage_ is not None:
        body["usage"] = usage_
    return body


def completion_chunk(rid: str, created: int, model: str, choices: list[dict[str, Any]],
                     usage_: dict[str, int] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": model,
                            "choices": choices}
    if usage_ is not None:
        body["usage"] = usage_
    return body


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def sglang_finish_reason(s: SampleText) -> dict[str, Any] | None:
    """SGLang's finish reason object: {"type": "stop", "matched": stop string or the stop token id}, length,
    abort."""
    if not s.done:
        return None
    if s.finish_reason == "stop":
        matched: Any = s.matched_stop
        if matched is None and s.token_ids:
            matched = s.token_ids[-1]  # the EOS or stop token that ended it
        return {"type": "stop", "matched": matched}
    if s.finish_reason == "length":
        return {"type": "length", "length": len(s.token_ids)}
    return {"type": s.finish_reason or "abort", "message": "aborted"}


def sglang_item(rid: str, s: SampleText, prompt_tokens: int, return_logprob: bool, weight_version: int | None,
                latency_s: float) -> dict[str, Any]:
    meta: dict[str, Any] = {"id": rid, "finish_reason": sglang_finish_reason(s),
                            "prompt_tokens": prompt_tokens, "completion_tokens": len(s.token_ids),
                            "cached_tokens": 0, "weight_version": weight_version, "e2e_latency": latency_s}
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for t, lp in zip(s.token_ids, s.logprobs)]
    return {"text": s.text, "output_ids": list(s.token_ids), "meta_info": meta}


def rollout_line(group: int, group_id: str | None, prompt_ids: tuple[int, ...], samples: list[SampleText],
                 weight_version: int | None, metadata: dict[str, Any] | None, with_text: bool) -> dict[str, Any]:
    responses = []
    for j, s in enumerate(samples):
        r: dict[str, Any] = {"index": j, "token_ids": list(s.token_ids), "logprobs": list(s.logprobs),
                             "finish_reason": s.finish_reason}
        if with_text:
            r["text"] = s.text
        responses.append(r)
    meta = {k: v for k, v in (metadata or {}).items() if k != "group_id"}
    return {"group": group, "group_id": group_id, "prompt_token_ids": list(prompt_ids),
            "weight_version": weight_version, "metadata": meta or None, "responses": responses}
