"""The bridge between the asyncio server and the rollout coordinator: batches, one worker thread, events back.

Why one worker thread running one rollout at a time: synchronous RL sends a whole batch at once and wants it
generated with one set of weights; ``RolloutCoordinator.rollout`` runs exactly such a batch to completion and
refuses to mix weight versions. So requests that arrive close together (until a gap of ``batch_window_s``, at
most ``batch_max_wait_s`` in all), or while a rollout runs, are merged (``grouping``) into the next
rollout; a weight update is a job in the same queue, so it waits for the running batch and everything queued
before it, and requests after it see the new weights.

Results flow back through the driver's listener: every chunk's tokens are posted, with
``loop.call_soon_threadsafe``, onto the submitting request's ``asyncio.Queue``. ``abort`` removes a waiting
request from the queue or asks the running driver to end its responses (at the next chunk boundary; their KV is
freed). ``shutdown`` fails every waiting and running request with a 503 error at once, so no client hangs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from seer.rollout.driver import RolloutDriver
from seer.rollout.types import RolloutListener
from seer.server.config import ServerConfig
from seer.server.convert import GroupSpec
from seer.server.grouping import GroupPlan, plan_groups
from seer.server.metrics import ServerMetrics
from seer.server.protocol import APIError

log = logging.getLogger("seer.server")

PENDING, RUNNING, DONE = "pending", "running", "done"


@dataclass(frozen=True)
class Started:
    weight_version: int


@dataclass(frozen=True)
class Tokens:
    part: int
    sample: int
    token_ids: list[int]
    logprobs: list[float]
    finished: bool
    finish_reason: str | None


@dataclass(frozen=True)
class Failed:
    error: APIError


Event = Started | Tokens | Failed


class Submission:
    """One HTTP request's groups; its events arrive on ``queue`` in the event loop that created it."""

    def __init__(self, parts: list[GroupSpec], loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.parts = parts
        self.loop = loop or asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.arrival = time.monotonic()
        self.state = PENDING
        self.index = -1                     # position in its batch
        self.batch: _Batch | None = None

    @property
    def num_samples(self) -> int:
        return sum(p.params.n for p in self.parts)

    def post(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:
            pass  # the event loop is closed: nobody is listening any more


class WeightJob:
    def __init__(self, source: str, version: int | None) -> None:
        self.source, self.version = source, version
        self.future: concurrent.futures.Future[int] = concurrent.futures.Future()
        self.arrival = time.monotonic()


class _Batch(RolloutListener):
    """One rollout's submissions, their group plan, and the driver once it exists."""

    def __init__(self, subs: list[Submission], plan: GroupPlan, metrics: ServerMetrics) -> None:
        self.subs, self.plan, self.metrics = subs, plan, metrics
        self.lock = threading.Lock()
        self.driver: RolloutDriver | None = None
        self.early: list[tuple[int, tuple[int, ...]]] = []

    def on_start(self, driver: RolloutDriver) -> None:
        with self.lock:
            self.driver, early, self.early = driver, self.early, []
        for gid, indices in early:
            driver.abort(gid, indices)
        self.metrics.attach(driver)

    def on_tokens(self, group_id: int, index: int, new_token_ids: list[int], new_logprobs: list[float],
                  finished: bool, finish_reason: str | None) -> None:
        s, p, j = self.plan.routes[(group_id, index)]
        self.subs[s].post(Tokens(p, j, list(new_token_ids), list(new_logprobs), finished, finish_reason))
        self.metrics.on_tokens(len(new_token_ids))

    def abort(self, sub: Submission, part: int | None = None, sample: int | None = None) -> None:
        parts = range(len(sub.parts)) if part is None else [part]
        targets = []
        for p in parts:
            gid, first = self.plan.targets[(sub.index, p)]
            n = sub.parts[p].params.n
            targets.append((gid, tuple(range(first, first + n)) if sample is None else (first + sample,)))
        with self.lock:
            driver = self.driver
            if driver is None:
                self.early += targets
        if driver is not None:
            for gid, indices in targets:
                driver.abort(gid, indices)


class Batcher:
    def __init__(self, coordinator: Any, config: ServerConfig, metrics: ServerMetrics | None = None) -> None:
        self.coordinator = coordinator
        self.config = config
        self.metrics = metrics or ServerMetrics()
        self._cond = threading.Condition()
        self._jobs: deque[Submission | WeightJob] = deque()
        self._batch: _Batch | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._loop, args=(self._torch_threads(),), name="seer-rollouts",
                                        daemon=True)
        self.last_output: Any = None  # the last rollout's RolloutOutput (tests and /metrics)

    # ------------------------------------------------------------------ event-loop side
    def start(self) -> None:
        if not self._thread.is_alive():
            self._thread.start()

    @staticmethod
    def _torch_threads() -> Any:
        """Give the worker thread the intra-op thread count the engines were built with in this thread (a new
        thread's OpenMP setting is not inherited), so the rollout runs as it would in process."""
        torch = sys.modules.get("torch")
        if torch is None:
            return lambda: None
        n = torch.get_num_threads()
        return lambda: torch.set_num_threads(n)

    def submit(self, sub: Submission) -> None:
        with self._cond:
            if self._closing:
                raise APIError("the server is shutting down", 503, "server_error", code="shutdown")
            self._jobs.append(sub)
            self.metrics.pending = self._pending_samples()
            self._cond.notify_all()

    def abort(self, sub: Submission, part: int | None = None, sample: int | None = None) -> None:
        """End a request's responses (or one of them) early; finished ones are left alone."""
        removed, batch = False, None
        with self._cond:
            if sub.state == PENDING:
                if part is not None:
                    return  # per-sample aborts come from streamed text, which a waiting request has none of
                self._jobs.remove(sub)
                sub.state, removed = DONE, True
                self.metrics.pending = self._pending_samples()
            elif sub.state == RUNNING:
                batch = sub.batch
        if removed:
            for p, spec in enumerate(sub.parts):
                for j in range(spec.params.n):
                    sub.post(Tokens(p, j, [], [], True, "abort"))
        elif batch is not None:
            batch.abort(sub, part, sample)

    async def update_weights(self, source: str, version: int | None = None) -> int:
        job = WeightJob(source, version)
        with self._cond:
            if self._closing:
                raise APIError("the server is shutting down", 503, "server_error", code="shutdown")
            self._jobs.append(job)
            self._cond.notify_all()
        return await asyncio.wrap_future(job.future)

    def shutdown(self, message: str = "the server is shutting down") -> None:
        """Fail every waiting and running request now (503) and stop the running rollout early."""
        err = APIError(message, 503, "server_error", code="shutdown")
        with self._cond:
            self._closing = True
            jobs, batch = list(self._jobs), self._batch
            self._jobs.clear()
            self._cond.notify_all()
        for job in jobs:
            if isinstance(job, WeightJob):
                if not job.future.done():
                    job.future.set_exception(err)
            else:
                job.state = DONE
                job.post(Failed(err))
        if batch is not None:
            for sub in batch.subs:
                sub.post(Failed(err))
                batch.abort(sub)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the worker thread to end (after ``shutdown``); returns whether it did."""
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until nothing is queued or running (tests)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._jobs or self._batch is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _pending_samples(self) -> int:
        return sum(j.num_samples for j in self._jobs if isinstance(j, Submission))

    # ------------------------------------------------------------------ worker thread
    def _loop(self, init_thread: Any) -> None:
        init_thread()
        while True:
            job = self._next_job()
            if job is None:
                return
            try:
                if isinstance(job, WeightJob):
                    self._update(job)
                else:
                    self._run(job)
            except Exception:  # noqa: BLE001 - the worker must outlive any one job
                log.exception("seer server worker: job failed")

    def _next_job(self) -> _Batch | WeightJob | None:
        with self._cond:
            while True:
                if self._closing:
                    return None
                if not self._jobs:
                    self._cond.wait()
                    continue
                cfg = self.config  # wait for a quiet gap of batch_window_s, at most batch_max_wait_s in all
                wait = min(self._jobs[-1].arrival + cfg.batch_window_s,
                           self._jobs[0].arrival + cfg.batch_max_wait_s) - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                if isinstance(self._jobs[0], WeightJob):
                    return self._jobs.popleft()
                subs: list[Submission] = []
                while self._jobs and isinstance(self._jobs[0], Submission):
                    subs.append(self._jobs.popleft())  # type: ignore[arg-type]
                self.metrics.pending = self._pending_samples()
                try:
                    plan = plan_groups([s.parts for s in subs], key_prefix=f"b{self.metrics.rollouts}-")
                except ValueError as err:
                    for s in subs:
                        s.state = DONE
                        s.post(Failed(APIError(str(err))))
                    continue
                batch = _Batch(subs, plan, self.metrics)
                for i, s in enumerate(subs):
                    s.state, s.index, s.batch = RUNNING, i, batch
                self._batch = batch
                return batch

    def _run(self, batch: _Batch) -> None:
        try:
            version = self.coordinator.weight_version
            for s in batch.subs:
                s.post(Started(version))
            t0 = time.perf_counter()
            out = self.coordinator.rollout(batch.plan.groups, policy=self.config.policy, progress=False,
                                           chunk_tokens=self.config.chunk_tokens, listener=batch)
            self.last_output = out
            self.metrics.on_rollout(out, time.perf_counter() - t0)
        except Exception as err:  # noqa: BLE001 - answered to every client of the batch
            log.exception("seer server: rollout failed")
            failure = Failed(APIError(f"the rollout failed: {err}", 500, "server_error"))
            for s in batch.subs:
                s.post(failure)
        finally:
            self.metrics.attach(None)
            with self._cond:
                for s in batch.subs:
                    s.state = DONE
                self._batch = None
                self._cond.notify_all()

    def _update(self, job: WeightJob) -> None:
        try:
            version = self.coordinator.update_weights(job.source, job.version)
        except Exception as err:  # noqa: BLE001 - reported to the caller
            job.future.set_exception(err)
        else:
            self.metrics.weight_version = version
            job.future.set_result(version)
        finally:
            with self._cond:
                self._cond.notify_all()
