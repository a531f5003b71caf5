"""One response as the client sees it: token ids, logprobs and text, cut at the first stop string, and what
has not been streamed yet.

Why on the server side: the engine stops on token ids only; OpenAI's ``stop`` strings are text, which may span
tokens and chunks. Tokens arrive a chunk at a time, so after each chunk the whole response is decoded again
(cheap next to a chunk of decoding) and searched; on a match the response is cut after the first token whose
text completes the stop string (as vLLM does), its finish reason becomes ``stop`` and the caller aborts what
the engine would still generate. While streaming, text that could still turn into a stop string, or that ends
in an incomplete UTF-8 character, is held back until the next chunk.
"""

from __future__ import annotations

from seer.models.tokenizer import Tokenizer
from seer.server.convert import OutputOptions


class SampleText:
    def __init__(self, tokenizer: Tokenizer, options: OutputOptions, stream: bool = True) -> None:
        self.tokenizer = tokenizer
        self.options = options
        self.stream = stream  # False: nobody reads the text before the end, so decode only then (no stops)
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.matched_stop: str | None = None
        self.done = False
        self._sent_text = 0
        self._sent_tokens = 0
        self._hold = max((len(s) for s in options.stop), default=1) - 1

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.options.skip_special_tokens)

    def _find(self, text: str) -> tuple[int, str] | None:
        hits = [(text.find(s), s) for s in self.options.stop]
        hits = [h for h in hits if h[0] >= 0]
        return min(hits) if hits else None

    def add(self, token_ids: list[int], logprobs: list[float], finished: bool, finish_reason: str | None) -> bool:
        """Append one chunk; returns True when a stop string ended the response before the engine did (the
        caller then aborts the rest of it). Chunks after the end are ignored."""
        if self.done:
            return False
        before = len(self.token_ids)
        self.token_ids += token_ids
        self.logprobs += logprobs
        if not finished and not self.stream and not self.options.stop:
            return False
        text = self._decode(self.token_ids)
        hit = self._find(text) if self.options.stop else None
        if hit is None:
            self.text = text
            if finished:
                self.done, self.finish_reason = True, finish_reason
            return False
        lo, hi = before, len(self.token_ids)  # decode(ids[:lo]) holds no stop string, decode(ids[:hi]) does
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._find(self._decode(self.token_ids[:mid])) is None:
                lo = mid
            else:
                hi = mid
        del self.token_ids[hi:], self.logprobs[hi:]
        text = self._decode(self.token_ids)
        pos, stop = self._find(text) or hit
        self.text = text[:pos + len(stop)] if self.options.include_stop else text[:pos]
        self.done, self.finish_reason, self.matched_stop = True, "stop", stop
        return not finished

    def delta(self) -> tuple[str, list[int], list[float]]:
        """Text, token ids and logprobs not streamed yet (text held back while it may still change)."""
        visible = self.text
        if not self.done:
            visible = visible.rstrip("\ufffd")
            if self._hold:
                visible = visible[:max(0, len(visible) - self._hold)]
        text = visible[self._sent_text:]
        self._sent_text = max(self._sent_text, len(visible))
        ids, lps = self.token_ids[self._sent_tokens:], self.logprobs[self._sent_tokens:]
        self._sent_tokens = len(self.token_ids)
        return text, ids, lps
