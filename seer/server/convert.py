"""From a validated request body to the groups a rollout runs: prompts as token ids, ``SamplingParams``, output
options (stop strings), after checking everything that could make a request fail inside a shared batch.

Why here and not in each route: the four generation endpoints differ only in how they name things (``max_tokens``
vs ``max_new_tokens``, ``prompt`` vs ``text`` vs ``input_ids``); the checks (model name, sampling values,
context length, KV capacity, vocabulary) and the tokenization must be the same for all, and must match the
in-process API: text prompts are encoded without special tokens and chat prompts through the checkpoint's chat
template, exactly as ``seer.LLM`` does, so greedy results over HTTP equal the in-process ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from seer.models.tokenizer import Tokenizer
from seer.sampling_params import SamplingParams
from seer.server.config import ModelLimits, ServerConfig
from seer.server.protocol import (
    APIError,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    GenerateRequest,
    RolloutRequest,
    RolloutSampling,
)

MAX_STOP_STRINGS = 16


@dataclass(frozen=True)
class OutputOptions:
    """How generated tokens become text for the client."""

    stop: tuple[str, ...] = ()
    include_stop: bool = False
    skip_special_tokens: bool = True


@dataclass(frozen=True)
class GroupSpec:
    """One prompt sampled ``params.n`` times, as one request asks for it."""

    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    group_id: str | None = None     # explicit grouping key sent by the client
    mergeable: bool = True          # may join other requests' samples of the same prompt into one group
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class Prepared:
    parts: list[GroupSpec]
    options: OutputOptions

    @property
    def num_samples(self) -> int:
        return sum(p.params.n for p in self.parts)


class RequestConverter:
    def __init__(self, tokenizer: Tokenizer, limits: ModelLimits, config: ServerConfig,
                 model_names: set[str]) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.config = config
        self.model_names = model_names

    # ------------------------------------------------------------------ shared checks
    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.model_names:
            raise APIError(f"The model '{name}' does not exist; this server serves '{self.config.model_name}'",
                           param="model", code="model_not_found")

    def params(self, *, n: int, max_tokens: int, temperature: float | None, top_p: float | None,
               top_k: int | None, seed: int | None, stop_token_ids: list[int] | None, ignore_eos: bool,
               max_tokens_name: str = "max_tokens") -> SamplingParams:
        if isinstance(n, int) and n > self.config.max_n:
            raise APIError(f"n must be at most {self.config.max_n}, got {n}", param="n")
        if seed is not None and not 0 <= seed < 2**63:
            raise APIError(f"seed must be in [0, 2^63), got {seed}", param="seed")
        for t in stop_token_ids or ():
            if not 0 <= t < self.limits.vocab_size:
                raise APIError(f"stop token id {t} is outside the vocabulary [0, {self.limits.vocab_size})",
                               param="stop_token_ids")
        try:
            return SamplingParams(n=n, temperature=1.0 if temperature is None else temperature,
                                  top_p=1.0 if top_p is None else top_p,
                                  top_k=-1 if top_k in (None, 0) else top_k, seed=seed, max_tokens=max_tokens,
                                  stop_token_ids=tuple(stop_token_ids or ()), ignore_eos=ignore_eos)
        except ValueError as err:
            field = re.match(r"SamplingParams\.(\w+)", str(err))
            name = field.group(1) if field else None
            message = str(err).replace("SamplingParams.", "")
            if name == "max_tokens":
                name, message = max_tokens_name, message.replace("max_tokens", max_tokens_name)
            raise APIError(message, param=name) from None

    def check_prompt(self, ids: list[int], max_tokens: int, prompt_name: str = "prompt",
                     max_tokens_name: str = "max_tokens") -> tuple[int, ...]:
        lim = self.limits
        if not ids:
            raise APIError("the prompt is empty", param=prompt_name)
        bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < lim.vocab_size), None)
        if bad is not None:
            raise APIError(f"prompt token id {bad!r} is outside the vocabulary [0, {lim.vocab_size})",
                           param=prompt_name, code="invalid_token_id")
        total = len(ids) + max_tokens
        if total > lim.max_model_len:
            raise APIError(f"This model's maximum context length is {lim.max_model_len} tokens. However, you "
                           f"requested {total} tokens ({len(ids)} in the prompt, {max_tokens} in the completion). "
                           f"Please reduce the length of the prompt or {max_tokens_name}.",
                           param=max_tokens_name, code="context_length_exceeded")
        if total > lim.kv_tokens:
            raise APIError(f"a response of {total} tokens needs more KV cache than one instance holds "
                           f"({lim.kv_tokens} tokens); lower {max_tokens_name}", param=max_tokens_name,
                           code="kv_capacity_exceeded")
        return tuple(ids)

    def default_max_tokens(self, prompt_len: int) -> int:
        """Up to the end of the context (as vLLM does), or of one instance's KV when that is smaller."""
        lim = self.limits
        return max(1, min(lim.max_model_len, lim.kv_tokens) - prompt_len)

    def stops(self, stop: str | list[str] | None) -> tuple[str, ...]:
        items = [stop] if isinstance(stop, str) else list(stop or [])
        items = [s for s in items if s]
        if len(items) > MAX_STOP_STRINGS:
            raise APIError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(items)}", param="stop")
        return tuple(items)

    @staticmethod
    def unsupported(**fields: tuple[Any, Any]) -> None:
        """Each field maps to (value, the value that means 'off'); anything else is refused."""
        for name, (value, off) in fields.items():
            if value is not None and value != off and value not in ((), [], {}):
                raise APIError(f"'{name}' is not supported by this server", param=name, code="unsupported")

    def _common_unsupported(self, req: CompletionRequest | ChatCompletionRequest) -> None:
        self.unsupported(presence_penalty=(req.presence_penalty, 0.0), frequency_penalty=(req.frequency_penalty, 0.0),
                         repetition_penalty=(req.repetition_penalty, 1.0), min_p=(req.min_p, 0.0),
                         min_tokens=(req.min_tokens, 0), logit_bias=(req.logit_bias, None),
                         use_beam_search=(req.use_beam_search, False))

    def _text_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def _parts(self, prompts: list[list[int]], req: CompletionRequest | ChatCompletionRequest,
               max_tokens: int | None, prompt_name: str, max_tokens_name: str) -> list[GroupSpec]:
        if len(prompts) > self.config.max_prompts:
            raise APIError(f"at most {self.config.max_prompts} prompts per request, got {len(prompts)}",
                           param=prompt_name)
        parts = []
        for ids in prompts:
            mt = self.default_max_tokens(len(ids)) if max_tokens is None else max_tokens
            sp = self.params(n=req.n, max_tokens=mt, temperature=req.temperature, top_p=req.top_p,
                             top_k=req.top_k, seed=req.seed, stop_token_ids=req.stop_token_ids,
                             ignore_eos=req.ignore_eos, max_tokens_name=max_tokens_name)
            parts.append(GroupSpec(self.check_prompt(ids, mt, prompt_name, max_tokens_name), sp, req.group_id))
        return parts

    # ------------------------------------------------------------------ endpoints
    def completion(self, req: CompletionRequest) -> Prepared:
        self.check_model(req.model)
        self._common_unsupported(req)
        self.unsupported(echo=(req.echo, False), suffix=(req.suffix, None))
        if req.best_of is not None and req.best_of != req.n:
            raise APIError("best_of must equal n (every sample is returned)", param="best_of")
        if req.logprobs is not None and not 0 <= req.logprobs <= self.config.max_logprobs:
            raise APIError(f"logprobs must be in [0, {self.config.max_logprobs}]", param="logprobs")
        p = req.prompt
        if isinstance(p, str):
            prompts = [self._text_ids(p)]
        elif not p:
            raise APIError("the prompt is empty", param="prompt")
        elif all(isinstance(x, int) for x in p):
            prompts = [list(p)]  # type: ignore[arg-type]
        elif all(isinstance(x, str) for x in p):
            prompts = [self._text_ids(x) for x in p]  # type: ignore[arg-type]
        else:
            prompts = [list(x) for x in p]  # type: ignore[arg-type]
        parts = self._parts(prompts, req, req.max_tokens, "prompt", "max_tokens")
        return Prepared(parts, OutputOptions(self.stops(req.stop), req.include_stop_str_in_output,
                                             req.skip_special_tokens))

    def chat_prompt(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
                    template_kwargs: dict[str, Any] | None = None) -> list[int]:
        msgs = []
        for m in messages:
            content = m.content
            if isinstance(content, list):
                texts = []
                for part in content:
                    if part.get("type") != "text" or not isinstance(part.get("text"), str):
                        raise APIError("only text content parts are supported", param="messages")
                    texts.append(part["text"])
                content = "".join(texts)
            msgs.append({**(m.model_extra or {}), "role": m.role, "content": content or ""})
        try:
            ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt,
                                                     **(template_kwargs or {}))
        except ValueError as err:
            raise APIError(str(err), param="messages") from None
        return list(ids)  # type: ignore[arg-type]

    def chat(self, req: ChatCompletionRequest) -> Prepared:
        self.check_model(req.model)
        self._common_unsupported(req)
        self.unsupported(tools=(req.tools, None))
        if req.response_format and req.response_format.get("type", "text") != "text":
            raise APIError("response_format other than text is not supported", param="response_format")
        if req.top_logprobs is not None and not 0 <= req.top_logprobs <= self.config.max_logprobs:
            raise APIError(f"top_logprobs must be in [0, {self.config.max_logprobs}]", param="top_logprobs")
        ids = self.chat_prompt(req.messages, req.add_generation_prompt, req.chat_template_kwargs)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        parts = self._parts([ids], req, max_tokens, "messages", name)
        return Prepared(parts, OutputOptions(self.stops(req.stop), req.include_stop_str_in_output,
                                             req.skip_special_tokens))

    def generate(self, req: GenerateRequest) -> Prepared:
        sp = req.sampling_params
        self.unsupported(presence_penalty=(sp.presence_penalty, 0.0), frequency_penalty=(sp.frequency_penalty, 0.0),
                         repetition_penalty=(sp.repetition_penalty, 1.0), min_p=(sp.min_p, 0.0),
                         min_new_tokens=(sp.min_new_tokens, 0))
        if (req.text is None) == (req.input_ids is None):
            raise APIError("give exactly one of 'text' or 'input_ids'", param="text")
        if req.text is not None:
            texts = [req.text] if isinstance(req.text, str) else req.text
            prompts = [self._text_ids(t) for t in texts]
        else:
            ids = req.input_ids or []
            prompts = [list(ids)] if not ids or isinstance(ids[0], int) else [list(x) for x in ids]  # type: ignore
        if not prompts or len(prompts) > self.config.max_prompts:
            raise APIError(f"give 1 to {self.config.max_prompts} prompts", param="text")
        seed = sp.sampling_seed if sp.sampling_seed is not None else sp.seed
        parts = []
        for ids in prompts:
            params = self.params(n=sp.n, max_tokens=sp.max_new_tokens, temperature=sp.temperature, top_p=sp.top_p,
                                 top_k=sp.top_k, seed=seed, stop_token_ids=sp.stop_token_ids,
                                 ignore_eos=sp.ignore_eos, max_tokens_name="max_new_tokens")
            name = "input_ids" if req.input_ids is not None else "text"
            parts.append(GroupSpec(self.check_prompt(ids, sp.max_new_tokens, name, "max_new_tokens"), params,
                                   req.group_id))
        return Prepared(parts, OutputOptions(self.stops(sp.stop), sp.no_stop_trim, sp.skip_special_tokens))

    def rollout(self, req: RolloutRequest) -> Prepared:
        self.check_model(req.model)
        if len(req.groups) > self.config.max_prompts:
            raise APIError(f"at most {self.config.max_prompts} groups per request", param="groups")
        base = req.sampling_params
        parts, stops = [], None
        for i, g in enumerate(req.groups):
            given = [x is not None for x in (g.prompt, g.messages, g.prompt_token_ids)]
            if sum(given) != 1:
                raise APIError(f"group {i}: give exactly one of prompt, messages, prompt_token_ids",
                               param=f"groups.{i}")
            if g.prompt is not None:
                ids = self._text_ids(g.prompt)
            elif g.messages is not None:
                ids = self.chat_prompt(g.messages)
            else:
                ids = list(g.prompt_token_ids or [])
            s = _merge(base, g.sampling_params)
            mt = 16 if s.max_tokens is None else s.max_tokens
            sp = self.params(n=g.n, max_tokens=mt, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                             seed=s.seed, stop_token_ids=s.stop_token_ids, ignore_eos=bool(s.ignore_eos))
            group_stops = self.stops(s.stop)
            if stops is not None and group_stops != stops:
                raise APIError("all groups of one rollout call must use the same stop strings", param="stop")
            stops = group_stops
            meta = {"group_id": g.group_id, **(g.metadata or {})}
            parts.append(GroupSpec(self.check_prompt(ids, mt, f"groups.{i}", "max_tokens"), sp, g.group_id,
                                   mergeable=False, metadata=meta))
        return Prepared(parts, OutputOptions(stops or ()))


def _merge(base: RolloutSampling, over: RolloutSampling | None) -> RolloutSampling:
    if over is None:
        return base
    data = base.model_dump()
    data.update({k: v for k, v in over.model_dump().items() if v is not None})
    return RolloutSampling.model_validate(data)
