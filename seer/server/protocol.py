"""Request bodies of the HTTP API (OpenAI completions/chat, SGLang ``/generate``, ``/v1/rollout``) and the
OpenAI-style error every bad request gets.

Why pydantic models with ``extra="ignore"``: RL frameworks send whatever their vLLM/SGLang client sends, often
with fields Seer does not need; ignoring unknown fields keeps them working, while fields that would change the
result and that Seer cannot honour (penalties, beam search, echo...) are rejected with a 400 naming the field,
never silently dropped. Values are checked again by ``SamplingParams`` when the request is converted.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class _OpenAISampling(_Body):
    """Fields shared by completions and chat completions (OpenAI's, then vLLM's extras, then Seer's)."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM extras that RL frameworks send
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False
    use_beam_search: bool = False
    # Seer: separate requests that carry the same group_id (and prompt) are sampled as one group
    group_id: str | None = None


class CompletionRequest(_OpenAISampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class ChatMessage(_Body):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None


class SGLangSampling(_Body):
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    seed: int | None = None
    min_new_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0


class GenerateRequest(_Body):
    """SGLang's ``/generate`` as slime and verl call it."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SGLangSampling = Field(default_factory=SGLangSampling)
    return_logprob: bool = False
    stream: bool = False
    rid: str | list[str] | None = None
    group_id: str | None = None


class RolloutSampling(_Body):
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None


class RolloutGroup(_Body):
    """One prompt (text, chat messages or token ids) sampled ``n`` times."""

    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    prompt_token_ids: list[int] | None = None
    n: int = 1
    sampling_params: RolloutSampling | None = None
    group_id: str | None = None
    metadata: dict[str, Any] | None = None


class RolloutRequest(_Body):
    """``/v1/rollout``: a whole batch of groups in one call; results come back as NDJSON, one line per group."""

    model: str | None = None
    groups: list[RolloutGroup] = Field(min_length=1)
    sampling_params: RolloutSampling = Field(default_factory=RolloutSampling)
    return_text: bool = True


class UpdateWeightsRequest(_Body):
    model_path: str
    weight_version: int | None = None

    @classmethod
    def parse(cls, data: Any) -> "UpdateWeightsRequest":
        if isinstance(data, dict) and "model_path" not in data and "path" in data:
            data = {**data, "model_path": data["path"]}
        return cls.model_validate(data)


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def parse_json(raw: bytes) -> Any:
    """The request body as JSON, or a 400 saying why not."""
    if not raw.strip():
        raise APIError("the request body is empty; send a JSON object", code="invalid_json")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise APIError(f"the request body is not valid JSON: {err}", code="invalid_json") from None


def validate(model: type[BaseModel], data: Any) -> Any:
    """``model.model_validate(data)``, turning the first validation error into an APIError naming the field."""
    if not isinstance(data, dict):
        raise APIError(f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        if model is UpdateWeightsRequest:
            return UpdateWeightsRequest.parse(data)
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        # union members add their type names to the location ('str', 'list[int]'): keep the field path only
        parts = [str(x) for x in first.get("loc", ()) if isinstance(x, str)]
        param = ".".join(x for x in parts if x.isidentifier() and x not in _TYPE_TAGS)
        raise APIError(f"invalid value for '{param or 'body'}': {first.get('msg')}", param=param or None) from None
