"""A torch-free stand-in for the model runner: next token = f(all previous tokens), so any schedule that feeds
the scheduler correct results must produce exactly the same sequences as an uninterrupted run."""

from __future__ import annotations

from seer.engine.request import Request
from seer.engine.scheduler import Scheduler, SchedulerOutput, StepResult

VOCAB = 50


def next_token(tokens: list[int]) -> int:
    return (sum(tokens[-3:]) * 7 + len(tokens)) % VOCAB


def reference(prompt: list[int], max_tokens: int) -> list[int]:
    """The tokens an uninterrupted run emits after ``prompt``: what every schedule must reproduce."""
    toks, out = list(prompt), []
    for _ in range(max_tokens):
        t = next_token(toks)
        out.append(t)
        toks.append(t)
    return out


def fake_execute(out: SchedulerOutput, reqs: dict[str, Request]) -> dict[str, StepResult]:
    results: dict[str, StepResult] = {}
    for c in out.chunks:
        if not c.samples:
            continue
        req = reqs[c.request_id]
        toks = req.all_token_ids()
        emitted: list[int] = []
        accepted = 0
        for d in req.spec_token_ids[:c.num_spec_tokens]:
            t = next_token(toks)
            if t != d:
                break
            emitted.append(t)
            toks = toks + [t]
            accepted += 1
        emitted.append(next_token(toks))
        results[c.request_id] = StepResult(emitted, [0.0] * len(emitted), accepted)
    return results


def run(s: Scheduler, drafts=None) -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    while s.has_unfinished:
        if drafts is not None:
            for r in s.running:
                r.spec_token_ids = drafts(r)
        out = s.schedule()
        for f in s.update_from_output(out, fake_execute(out, s.requests)):
            done[f.request_id] = f.output_token_ids
        s.check_integrity()
    return done
