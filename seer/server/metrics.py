"""``/metrics`` in the Prometheus text format: throughput, per-instance load, and the last rollout's figures.

Why these: an RL operator watching a Seer rollout server wants to know whether it is generating (tokens/s over
the last seconds), where the work sits (chunks running per instance, paused requests holding KV per instance,
requests waiting in the global buffer, samples waiting for the next batch), and how the last batch went in
the terms of docs/design.md (makespan, throughput, tail, tau). Live figures are read from the running driver when
scraped; plain reads of its counters from another thread are safe enough for a gauge, and anything that fails
mid-update is skipped for that scrape rather than locked against the rollout.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import Any

WINDOW_S = 10.0


class ServerMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._window: deque[tuple[float, int]] = deque()
        self._requests: Counter[tuple[str, int]] = Counter()
        self._driver: Any = None
        self.tokens_total = 0
        self.rollouts = 0
        self.pending = 0                       # samples waiting for the next batch
        self.weight_version = 0
        self.last: dict[str, float] = {}
        self.started = time.time()

    # ------------------------------------------------------------------ updates (any thread)
    def attach(self, driver: Any) -> None:
        self._driver = driver

    def on_tokens(self, n: int) -> None:
        now = time.monotonic()
        with self._lock:
            self.tokens_total += n
            self._window.append((now, n))
            while self._window and self._window[0][0] < now - WINDOW_S:
                self._window.popleft()

    def on_request(self, path: str, status: int) -> None:
        with self._lock:
            self._requests[(path, status)] += 1

    def on_rollout(self, out: Any, wall_s: float) -> None:
        m = out.metrics
        inst = out.result.stats.get("instances", {}).values()
        steps = sum(int(s.get("spec_steps", 0)) for s in inst)
        gained = sum(int(s.get("spec_accepted", 0)) + int(s.get("spec_bonus", 0)) for s in inst)
        with self._lock:
            self.rollouts += 1
            self.weight_version = out.weight_version
            self.last = {"makespan_seconds": m.makespan_s, "throughput_tokens_per_second": m.throughput_tok_s,
                         "tail_seconds": m.tail_s, "wall_seconds": wall_s, "responses": m.num_responses,
                         "generated_tokens": m.generated_tokens,
                         "aborted": out.result.stats.get("aborted", 0),
                         "tau": gained / steps if steps else 0.0}

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            if not self._window:
                return 0.0
            recent = sum(n for t, n in self._window if t >= now - WINDOW_S)
            span = min(WINDOW_S, max(now - self._window[0][0], 1e-3))
        return recent / span

    # ------------------------------------------------------------------ exposition
    def _live(self) -> dict[str, Any]:
        driver = self._driver
        if driver is None:
            return {}
        try:
            per = {}
            for iid, inst in sorted(driver.instances.items()):
                per[iid] = (len(driver.buffer.running_on(iid)), len(inst.resident()), int(iid in driver.alive))
            return {"instances": per, "queued": driver.buffer.num_buffered, "finished": driver.buffer.num_finished,
                    "requests": driver.buffer.num_requests}
        except (RuntimeError, KeyError, AttributeError):
            return {}

    def render(self) -> str:
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP seer_{name} {help_}")
            out.append(f"# TYPE seer_{name} {kind}")
            for labels, value in samples:
                out.append(f"seer_{name}{labels} {_num(value)}")

        live = self._live()
        with self._lock:
            requests = sorted(self._requests.items())
            last, total, rollouts = dict(self.last), self.tokens_total, self.rollouts
        metric("generation_tokens_total", "counter", "Tokens generated since the server started.", [("", total)])
        metric("tokens_per_second", "gauge", f"Tokens generated per second over the last {WINDOW_S:.0f} s.",
               [("", self.tokens_per_second())])
        metric("http_requests_total", "counter", "HTTP requests answered, by path and status code.",
               [(f'{{path="{p}",code="{c}"}}', n) for (p, c), n in requests])
        metric("rollouts_total", "counter", "Rollouts (batches) completed.", [("", rollouts)])
        metric("weight_version", "gauge", "Weight version of the served model.", [("", self.weight_version)])
        metric("pending_samples", "gauge", "Samples waiting for the next batch.", [("", self.pending)])
        metric("rollout_running", "gauge", "1 while a rollout runs.", [("", 1 if live else 0)])
        inst = live.get("instances", {})
        metric("instance_running", "gauge", "Chunks running on each instance.",
               [(f'{{instance="{i}"}}', v[0]) for i, v in inst.items()])
        metric("instance_resident", "gauge", "Paused requests whose KV stays on each instance.",
               [(f'{{instance="{i}"}}', v[1]) for i, v in inst.items()])
        metric("instance_alive", "gauge", "1 if the instance is alive.",
               [(f'{{instance="{i}"}}', v[2]) for i, v in inst.items()])
        metric("queued_requests", "gauge", "Responses waiting in the global request buffer for their next chunk.",
               [("", live.get("queued", 0))])
        metric("batch_finished_fraction", "gauge", "Fraction of the running batch's responses finished.",
               [("", live["finished"] / live["requests"] if live.get("requests") else 0.0)])
        for key, help_ in (("makespan_seconds", "Makespan of the last rollout."),
                           ("throughput_tokens_per_second", "Generated tokens / makespan of the last rollout."),
                           ("tail_seconds", "Makespan minus the time 90% of the last rollout's responses finished."),
                           ("tau", "Mean acceptance length of speculative decoding in the last rollout."),
                           ("responses", "Responses in the last rollout."),
                           ("aborted", "Responses aborted in the last rollout.")):
            metric(f"last_rollout_{key}", "gauge", help_, [("", last.get(key, 0.0))])
        return "\n".join(out) + "\n"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"
