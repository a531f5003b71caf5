"""Per-group suffix structure: where has the end of a request's context been seen before, and what followed?

Why this shape. Grouped speculative decoding drafts a request's next tokens from what its siblings (and its own
past, and the prompt) wrote after the same recent context. The classic structure is a depth-bounded suffix trie
(one node per distinct substring of up to ``max_depth`` tokens), but it costs up to ``max_depth`` nodes per
token (tens of MB per group in Python) and caps how far a draft may follow a match. Instead this index keeps:

* each stream's tokens once, in a plain list (a stream = one sibling response, the prompt, or an earlier
  iteration's response to the same prompt);
* for a few n-gram lengths ``L`` (``levels``), a dict from the last ``L`` tokens to the positions where they
  end (the occurrence lists of the suffix tree's depth-``L`` nodes).

A lookup takes the longest indexed n-gram of the context that occurs, extends each occurrence's match backwards
token by token (exact match length up to ``max_pattern``), and returns the occurrences. The drafter then reads
the continuation straight out of the stream, as far as it likes, and counts how many occurrences agree on each
next token (the per-node frequencies of the suffix tree, computed on the few nodes a draft needs). Memory is
``O(tokens * len(levels))`` and an append costs ``len(levels)`` dict operations per token.

No-own-future rule: a stream only ever holds tokens that were appended, and the engine appends only generated
(accepted) tokens, so a request whose own stream is in the index can only match its own past. A match that
ends at the last token of a stream has nothing after it and is never returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterable, NamedTuple, Sequence

__all__ = ["SuffixIndexConfig", "Match", "SuffixIndex"]

_SHIFT = 32
_POS_MASK = (1 << _SHIFT) - 1


@dataclass(frozen=True)
class SuffixIndexConfig:
    """``levels``: indexed n-gram lengths (ascending, starting at 1). ``max_pattern``: matches are measured up to
    this many tokens. ``max_candidates``: most recent occurrences examined per level (bounds lookup cost on very
    common n-grams)."""

    levels: tuple[int, ...] = (1, 2, 4, 8, 16)
    max_pattern: int = 64
    max_candidates: int = 32
    min_candidates: int = 4

    def __post_init__(self) -> None:
        lv = self.levels
        if not lv or lv[0] != 1 or any(b <= a for a, b in zip(lv, lv[1:])):
            raise ValueError(f"levels must be strictly ascending and start at 1, got {lv}")
        if self.max_pattern < lv[-1]:
            raise ValueError(f"max_pattern ({self.max_pattern}) must be >= the largest level ({lv[-1]})")
        if self.max_candidates < 1 or self.min_candidates < 1:
            raise ValueError("max_candidates and min_candidates must be >= 1")


class Match(NamedTuple):
    """An occurrence of the context's last ``length`` tokens in ``stream_id``, ending at index ``end``."""

    stream_id: Hashable
    end: int
    length: int


class SuffixIndex:
    """All streams of one group (or one prompt key), appendable token by token."""

    def __init__(self, config: SuffixIndexConfig | None = None) -> None:
        self.config = config or SuffixIndexConfig()
        self._levels = self.config.levels
        self._index: list[dict[Hashable, list[int]]] = [{} for _ in self._levels]
        self._streams: list[list[int] | None] = []
        self._ids: dict[Hashable, int] = {}
        self._names: list[Hashable] = []
        self.num_tokens = 0
        self._upper = list(zip(self._levels[1:], self._index[1:]))
        self._sole_writer = -1  # stream that alone appended since it was created (see remove_stream)

    # ---------------------------------------------------------------- streams
    def has_stream(self, stream_id: Hashable) -> bool:
        return stream_id in self._ids

    def stream_ids(self) -> list[Hashable]:
        return list(self._ids)

    def stream(self, stream_id: Hashable) -> Sequence[int]:
        """The tokens of a stream (a read-only view by convention: do not mutate)."""
        return self._streams[self._sidx(stream_id)]  # type: ignore[return-value]

    def stream_tokens(self, sidx: int) -> list[int]:
        """Internal-index access used by the drafter's fast path."""
        return self._streams[sidx]  # type: ignore[return-value]

    def _sidx(self, stream_id: Hashable) -> int:
        try:
            return self._ids[stream_id]
        except KeyError:
            raise KeyError(f"unknown stream {stream_id!r}") from None

    def append(self, stream_id: Hashable, tokens: Iterable[int]) -> None:
        """Append tokens to a stream, creating it on first use."""
        sidx = self._ids.get(stream_id)
        if sidx is None:
            sidx = len(self._streams)
            self._ids[stream_id] = sidx
            self._names.append(stream_id)
            self._streams.append([])
            self._sole_writer = sidx
        elif sidx != self._sole_writer:
            self._sole_writer = -1
        toks = self._streams[sidx]
        assert toks is not None
        base = sidx << _SHIFT
        d1 = self._index[0]
        upper = self._upper
        before = len(toks)
        for t in tokens:
            toks.append(t)
            p = len(toks)
            occ = base | (p - 1)
            lst = d1.get(t)
            if lst is None:
                d1[t] = [occ]
            else:
                lst.append(occ)
            for n, d in upper:
                if n > p:
                    break
                key = tuple(toks[-n:])
                lst = d.get(key)
                if lst is None:
                    d[key] = [occ]
                else:
                    lst.append(occ)
        self.num_tokens += len(toks) - before

    def remove_stream(self, stream_id: Hashable) -> None:
        """Forget a stream and all its occurrences (e.g. an aborted request, or a replay's own stream).

        Fast path: a stream that was the only writer since it was created has all its occurrences at the ends
        of the occurrence lists, so they are popped off; otherwise the touched lists are filtered.
        """
        sidx = self._sidx(stream_id)
        toks = self._streams[sidx]
        assert toks is not None
        sole = sidx == self._sole_writer
        for li, n in enumerate(self._levels):
            d = self._index[li]
            keys = [toks[p] if n == 1 else tuple(toks[p - n + 1 : p + 1]) for p in range(n - 1, len(toks))]
            if sole:
                for p in range(len(toks) - 1, n - 2, -1):
                    lst = d[keys[p - n + 1]]
                    if lst.pop() != (sidx << _SHIFT) | p:
                        raise AssertionError(f"occurrence lists out of order while removing {stream_id!r}")
                    if not lst:
                        del d[keys[p - n + 1]]
                continue
            for key in set(keys):
                kept = [o for o in d[key] if (o >> _SHIFT) != sidx]
                if kept:
                    d[key] = kept
                else:
                    del d[key]
        self.num_tokens -= len(toks)
        self._streams[sidx] = None
        del self._ids[stream_id]
        self._sole_writer = -1

    # ---------------------------------------------------------------- lookup
    def candidates(self, context: Sequence[int], exclude: int = -1) -> list[tuple[int, int, int]]:
        """Fast path: ``(sidx, end, length)`` of occurrences of the context's suffix that have a continuation.

        Starts at the longest indexed n-gram of the context that occurs with a continuation, and keeps going down
        the levels until at least ``min_candidates`` occurrences were found (more evidence for voting).
        """
        cfg = self.config
        levels, index, streams = self._levels, self._index, self._streams
        n_ctx = len(context)
        max_pat = min(cfg.max_pattern, n_ctx)
        out: list[tuple[int, int, int]] = []
        seen: set[int] = set()
        for li in range(len(levels) - 1, -1, -1):
            n = levels[li]
            if n > n_ctx:
                continue
            key = context[-1] if n == 1 else tuple(context[n_ctx - n :])
            lst = index[li].get(key)
            if not lst:
                continue
            for occ in lst[-cfg.max_candidates :]:
                if occ in seen:
                    continue
                seen.add(occ)
                sidx = occ >> _SHIFT
                if sidx == exclude:
                    continue
                end = occ & _POS_MASK
                toks = streams[sidx]
                if end + 1 >= len(toks):  # type: ignore[arg-type]
                    continue
                m = n
                while m < max_pat and m <= end and toks[end - m] == context[n_ctx - 1 - m]:  # type: ignore[index]
                    m += 1
                out.append((sidx, end, m))
            if len(out) >= cfg.min_candidates:
                break
        return out

    def find_matches(self, context: Sequence[int], exclude_stream: Hashable | None = None) -> list[Match]:
        """Occurrences of the context's suffix (with a continuation), longest first."""
        if len(context) == 0:
            raise ValueError("context must hold at least one token")
        exclude = self._ids.get(exclude_stream, -1) if exclude_stream is not None else -1
        found = self.candidates(context, exclude)
        found.sort(key=lambda c: (-c[2], c[0], c[1]))
        return [Match(self._names[s], e, m) for s, e, m in found]

    # ---------------------------------------------------------------- checks
    def memory_entries(self) -> int:
        """Stored tokens plus occurrence entries: a proxy for memory use."""
        return self.num_tokens + sum(len(lst) for d in self._index for lst in d.values())

    def check_integrity(self) -> None:
        """Recompute the occurrence lists from the streams and compare; raise AssertionError on any mismatch."""
        expect: list[dict[Hashable, list[int]]] = [{} for _ in self._levels]
        total = 0
        for sidx, toks in enumerate(self._streams):
            if toks is None:
                continue
            total += len(toks)
            for p in range(len(toks)):
                for li, n in enumerate(self._levels):
                    if n > p + 1:
                        break
                    key = toks[p] if n == 1 else tuple(toks[p - n + 1 : p + 1])
                    expect[li].setdefault(key, []).append((sidx << _SHIFT) | p)
        assert total == self.num_tokens, f"num_tokens {self.num_tokens} != {total} stored"
        for li, n in enumerate(self._levels):
            got = self._index[li]
            assert set(got) == set(expect[li]), f"level {n}: key sets differ"
            for got_key, lst in got.items():
                assert lst, f"level {n}: empty occurrence list for {got_key!r}"
                assert sorted(lst) == sorted(expect[li][got_key]), f"level {n}: occurrences of {got_key!r} differ"
        assert set(self._ids.values()) == {i for i, t in enumerate(self._streams) if t is not None}
        for name, sidx in self._ids.items():
            assert self._names[sidx] == name, f"stream name table broken for {name!r}"
