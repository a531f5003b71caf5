"""``/metrics`` through ``prometheus_client``: throughput, per-instance load, and the last rollout's figures.

Why these: an RL operator watching a Seer rollout server wants to know whether it is generating (tokens/s over
the last seconds), where the work sits (chunks running per instance, paused requests holding KV per instance,
requests waiting in the global buffer, samples waiting for the next batch), and how the last batch went in
the terms of docs/design.md (makespan, throughput, tail, tau). Live figures are read from the running driver when
scraped; plain reads of its counters from another thread are safe enough for a gauge, and anything that fails
mid-update is skipped for that scrape rather than locked against the rollout.

Why a collector on a registry of its own: every figure is computed at scrape time from the state below (one
source of truth, read by the batcher and tests too), and several servers in one process (tests) never share or
clash on the library's global registry.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
except ModuleNotFoundError as err:  # pragma: no cover - the serve extra installs it
    raise ModuleNotFoundError("seer serve needs prometheus_client for /metrics: install the serve extra "
                              "(pip install 'seer[serve]', or -e '.[serve]' in a checkout)",
                              name="prometheus_client") from err

WINDOW_S = 10.0
CONTENT_TYPE = CONTENT_TYPE_LATEST  # the media type of ``render()``'s text

# the last rollout's figures: key in ServerMetrics.last -> help of gauge seer_last_rollout_<key>
LAST_ROLLOUT = {"makespan_seconds": "Makespan of the last rollout.",
                "throughput_tokens_per_second": "Generated tokens / makespan of the last rollout.",
                "tail_seconds": "Makespan minus the time 90% of the last rollout's responses finished.",
                "tau": "Mean acceptance length of speculative decoding in the last rollout.",
                "responses": "Responses in the last rollout.",
                "aborted": "Responses aborted in the last rollout."}


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
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(self))

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
    def live(self) -> dict[str, Any]:
        """The running rollout's figures ({} between rollouts or when a read races an update)."""
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

    def snapshot(self) -> tuple[list[tuple[tuple[str, int], int]], dict[str, float], int, int]:
        """Requests by (path, status), the last rollout's figures, tokens and rollouts so far: one consistent read."""
        with self._lock:
            return sorted(self._requests.items()), dict(self.last), self.tokens_total, self.rollouts

    def render(self) -> bytes:
        """The Prometheus text exposition of every figure, as ``/metrics`` answers it (media type ``CONTENT_TYPE``)."""
        return generate_latest(self.registry)


class _Collector:
    """Reads a ``ServerMetrics`` into metric families at each scrape."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        live = m.live()
        requests, last, tokens, rollouts = m.snapshot()
        yield CounterMetricFamily("seer_generation_tokens", "Tokens generated since the server started.", tokens)
        yield _gauge("tokens_per_second", f"Tokens generated per second over the last {WINDOW_S:.0f} s.",
                     m.tokens_per_second())
        http = CounterMetricFamily("seer_http_requests", "HTTP requests answered, by path and status code.",
                                   labels=["path", "code"])
        for (path, code), n in requests:
            http.add_metric([path, str(code)], n)
        yield http
        yield CounterMetricFamily("seer_rollouts", "Rollouts (batches) completed.", rollouts)
        yield _gauge("weight_version", "Weight version of the served model.", m.weight_version)
        yield _gauge("pending_samples", "Samples waiting for the next batch.", m.pending)
        yield _gauge("rollout_running", "1 while a rollout runs.", 1 if live else 0)
        yield from _instance_gauges(live.get("instances", {}))
        yield _gauge("queued_requests", "Responses waiting in the global request buffer for their next chunk.",
                     live.get("queued", 0))
        yield _gauge("batch_finished_fraction", "Fraction of the running batch's responses finished.",
                     live["finished"] / live["requests"] if live.get("requests") else 0.0)
        for key, help_ in LAST_ROLLOUT.items():
            yield _gauge(f"last_rollout_{key}", help_, last.get(key, 0.0))


def _gauge(name: str, help_: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"seer_{name}", help_, value=value)


def _instance_gauges(instances: dict[int, tuple[int, int, int]]) -> Iterator[GaugeMetricFamily]:
    """Per-instance gauges, labelled ``instance``: chunks running, paused requests resident, alive."""
    for column, (name, help_) in enumerate((("running", "Chunks running on each instance."),
                                            ("resident", "Paused requests whose KV stays on each instance."),
                                            ("alive", "1 if the instance is alive."))):
        family = GaugeMetricFamily(f"seer_instance_{name}", help_, labels=["instance"])
        for iid, values in instances.items():
            family.add_metric([str(iid)], values[column])
        yield family
