"""The asyncio side of one request: submit its groups, turn the worker's events into per-sample state, and
abort when the client goes away.

Why one helper for every endpoint: whether a route answers with one JSON body, an SSE stream or NDJSON lines,
the lifecycle is the same: submit; apply events (a stop string found in the text aborts the rest of that
sample); watch the connection, since a client that disconnects must not keep the engine busy or hold KV; and on
any exit before the end (client gone, stream cancelled, error) abort whatever is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from seer.models.tokenizer import Tokenizer
from seer.server.batcher import Batcher, Failed, Started, Submission, Tokens
from seer.server.convert import Prepared
from seer.server.sequences import SampleText


class Collector:
    def __init__(self, batcher: Batcher, sub: Submission, tokenizer: Tokenizer, prepared: Prepared,
                 stream: bool = False) -> None:
        self.batcher = batcher
        self.sub = sub
        self.prepared = prepared
        self.samples = [[SampleText(tokenizer, prepared.options, stream) for _ in range(part.params.n)]
                        for part in prepared.parts]
        self.remaining = sub.num_samples
        self.weight_version: int | None = None
        self.t0 = time.monotonic()
        offsets, total = [], 0
        for part in prepared.parts:
            offsets.append(total)
            total += part.params.n
        self.offsets = offsets          # choice index of each part's first sample

    @property
    def finished(self) -> bool:
        return self.remaining == 0

    def choice_index(self, part: int, sample: int) -> int:
        return self.offsets[part] + sample

    def part_done(self, part: int) -> bool:
        return all(s.done for s in self.samples[part])

    def _apply(self, event: Any) -> set[tuple[int, int]]:
        if isinstance(event, Started):
            self.weight_version = event.weight_version
            return set()
        if isinstance(event, Failed):
            raise event.error
        assert isinstance(event, Tokens)
        s = self.samples[event.part][event.sample]
        was_done = s.done
        if was_done:
            return set()  # e.g. the engine's end of a sample a stop string already ended
        if s.add(event.token_ids, event.logprobs, event.finished, event.finish_reason):
            self.batcher.abort(self.sub, event.part, event.sample)  # a stop string ended it: stop the engine
        if s.done and not was_done:
            self.remaining -= 1
        return {(event.part, event.sample)}

    async def updates(self) -> AsyncIterator[set[tuple[int, int]]]:
        """Yield the (part, sample) pairs that changed, until every sample is done; raises ``APIError`` if the
        batch failed or the server shuts down."""
        queue = self.sub.queue
        while self.remaining:
            changed = self._apply(await queue.get())
            while self.remaining and not queue.empty():
                changed |= self._apply(queue.get_nowait())
            if changed:
                yield changed

    async def wait(self) -> None:
        async for _ in self.updates():
            pass

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.token_ids) for part in self.samples for s in part)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p.prompt_token_ids) for p in self.prepared.parts)


async def _watch_disconnect(receive: Any, on_disconnect: Any) -> None:
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            on_disconnect()
            return


@contextlib.asynccontextmanager
async def serving(receive: Any, batcher: Batcher, tokenizer: Tokenizer, prepared: Prepared,
                  stream: bool = False) -> AsyncIterator[Collector]:
    """Submit ``prepared`` and yield its collector; a disconnect (heard on ``receive``) or leaving early aborts
    the request's responses, which frees their KV in the engine."""
    sub = Submission(prepared.parts)
    collector = Collector(batcher, sub, tokenizer, prepared, stream)
    batcher.submit(sub)
    watcher = asyncio.create_task(_watch_disconnect(receive, lambda: batcher.abort(sub)))
    try:
        yield collector
    finally:
        watcher.cancel()
        if not collector.finished:
            batcher.abort(sub)
