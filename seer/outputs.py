"""Generation results in vLLM's shape: one ``RequestOutput`` per prompt, one ``CompletionOutput`` per sample.

For the common n=1 case the first completion's fields are also reachable on the request output itself
(``out.token_ids``, ``out.text``...), as vLLM users expect.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None
    request_id: str = ""
    num_cached_prompt_tokens: int = 0

    def to_dict(self) -> dict:
        return {"index": self.index, "token_ids": self.token_ids, "logprobs": self.logprobs, "text": self.text,
                "finish_reason": self.finish_reason}


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    prompt: str | None
    outputs: list[CompletionOutput] = field(default_factory=list)
    error: str | None = None

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def logprobs(self) -> list[float]:
        return self.outputs[0].logprobs

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    def to_dict(self) -> dict:
        return {"request_id": self.request_id, "prompt": self.prompt, "prompt_token_ids": self.prompt_token_ids,
                "outputs": [o.to_dict() for o in self.outputs], "error": self.error}
