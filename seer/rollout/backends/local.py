"""Instances as separate processes on this machine: real parallelism, wall-clock time.

Each instance process (``instances/worker.py``) owns an engine with its own torch threads (one each by default, so
two instances use the two cores of a small machine). The coordinator keeps the request buffer and the rollout
driver; it reacts to step reports as they arrive, forwards each instance's new tokens to the other instances'
draft-server replicas (drafts may be a step stale, never wrong), and moves KV between instances through a
file-backed pool in shared memory. A process that dies is noticed, and its requests continue elsewhere.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import wait

from seer.rollout.backends.base import Backend, BroadcastDrafts, profile_here
from seer.rollout.driver import RolloutDriver
from seer.rollout.file_pool import FileKVPool
from seer.rollout.instances.base import ChunkStart, Instance, InstanceLost
from seer.rollout.instances.remote import RemoteInstanceProxy
from seer.rollout.instances.worker import WorkerSpec, worker_main
from seer.rollout.policies import RolloutPolicy, get_policy
from seer.rollout.stall import StallWatch
from seer.rollout.types import FaultPlan, RolloutStalled
from seer.spec.policy import VerifyCostModel

READY_TIMEOUT_S = 600.0


class WorkerProxy(RemoteInstanceProxy):
    """An instance process, reached through a pipe."""

    def __init__(self, iid: int, proc: mp.Process, conn, snap: dict, answer_timeout_s: float = 60.0) -> None:
        super().__init__(iid, snap)
        self.proc = proc
        self.conn = conn
        self.inbox: list[tuple] = []
        self.answer_timeout_s = answer_timeout_s  # a worker silent this long is stalled, never waited on forever

    def send_start(self, chunk: ChunkStart, number: int) -> None:
        try:
            self.conn.send(("start", chunk, number))
        except (BrokenPipeError, OSError) as err:
            raise InstanceLost(self.instance_id) from err

    def evict(self, request_id: int) -> int:
        blocks = self.forget_resident(request_id)
        try:
            self.conn.send(("evict", request_id))
            deadline = time.monotonic() + self.answer_timeout_s
            while True:  # other messages that arrive meanwhile are kept for the main loop
                if not self.conn.poll(min(0.5, max(0.0, deadline - time.monotonic()))):
                    if not self.proc.is_alive():
                        raise EOFError("the instance process died")
                    if time.monotonic() < deadline:
                        continue
                    raise RolloutStalled(f"instance {self.instance_id} did not answer an eviction within "
                                         f"{self.answer_timeout_s:g} s (stall timeout)")
                msg = self.conn.recv()
                if msg[0] == "evicted" and msg[1] == request_id:
                    self.snap["free_blocks"] += blocks
                    return int(msg[2])
                self.inbox.append(msg)
        except (EOFError, OSError) as err:  # the process died before answering
            errors = [m[1] for m in self.inbox if m[0] == "error"]
            if errors:  # it failed on a bug rather than being killed: say what happened
                raise RuntimeError(f"instance {self.instance_id} failed:\n{errors[0]}") from err
            raise InstanceLost(self.instance_id) from err

    def release(self, request_id: int) -> None:
        self.forget_resident(request_id)
        try:
            self.conn.send(("release", request_id))
        except (BrokenPipeError, OSError):
            pass  # a dead process holds no KV


class ProcessBackend(Backend):
    def __init__(self, model: str, config, pool) -> None:
        super().__init__(model, config)
        if config.instances > (os.cpu_count() or 1):
            raise ValueError(f"{config.instances} instances need at least as many cores; this machine has "
                             f"{os.cpu_count()} (use --backend inprocess or ray for more)")
        self.engine = config.instance_engine(model, default_threads=config.process_threads())
        self.pool = FileKVPool.create(int(config.pool_budget_gb * 2**30), config.spill_dir)
        self.ctx = mp.get_context("spawn")
        self.proxies: dict[int, WorkerProxy] = {}
        self._spec_key: object = "unset"
        self._weights: tuple[object, int] | None = None  # the last weights pushed, for respawned workers
        self.after_weights_sent: Callable[[], None] | None = None  # fault injection (seer bench faults)

    # ------------------------------------------------------------------ processes
    def _spawn(self, policy: RolloutPolicy) -> None:
        spec = self.config.spec if policy.speculative else None
        key = (spec, self.engine)
        if self.proxies and key == self._spec_key and all(p.proc.is_alive() for p in self.proxies.values()):
            return
        self.close_workers()
        profile = self.verify_cost().to_profile() if spec is not None and spec.adaptive else None
        pool_dirs = (str(self.pool.memory_dir), str(self.pool.spill_dir), self.pool.budget_bytes)
        pending = {}
        for iid in range(self.config.instances):
            parent, child = self.ctx.Pipe()
            ws = WorkerSpec(iid, self.engine, pool_dirs, spec, profile)
            proc = self.ctx.Process(target=worker_main, args=(child, ws), daemon=True, name=f"seer-instance-{iid}")
            proc.start()
            child.close()  # the worker holds its end: when it dies, this end reads EOF at once
            pending[iid] = (proc, parent)
        for iid, (proc, conn) in pending.items():
            if not conn.poll(READY_TIMEOUT_S):
                raise RuntimeError(f"instance {iid} did not start within {READY_TIMEOUT_S:.0f} s")
            msg = conn.recv()
            if msg[0] != "ready":
                raise RuntimeError(f"instance {iid} failed to start:\n{msg[1]}")
            self.proxies[iid] = WorkerProxy(iid, proc, conn, msg[1], self.config.stall_timeout_s)
        self._spec_key = key
        if self._weights is not None:  # new workers load the checkpoint: give them the weights of this run
            self._push_weights(*self._weights)

    def weight_versions(self) -> list[int]:
        if not self.proxies:
            return [self._weights[1] if self._weights is not None else 0]
        return [p.snap["weight_version"] for p in self.proxies.values()]

    def update_weights(self, source, version: int | None = None) -> int:
        """Push new weights to every worker. A worker that died (here or earlier) makes this a clear error;
        the next call respawns the workers, reloads the last weights pushed, then pushes the new ones."""
        if not self.proxies or not all(p.proc.is_alive() for p in self.proxies.values()):
            self._spawn(get_policy("verl"))
        new = self._push_weights(source, version)
        self._weights = (source, new)
        return new

    def _push_weights(self, source, version: int | None) -> int:
        versions = set()
        for iid, p in self.proxies.items():
            try:
                p.conn.send(("update_weights", source, version))
            except (BrokenPipeError, OSError) as err:
                raise RuntimeError(f"instance {iid} is gone; its weight update failed (the next update "
                                   f"restarts the instances)") from err
        if self.after_weights_sent is not None:
            self.after_weights_sent()
        for iid, p in self.proxies.items():
            versions.add(self._await_weights(iid, p))
        lost = [iid for iid, p in self.proxies.items() if not p.proc.is_alive()]
        if lost:  # died after answering: the instance is gone all the same
            raise RuntimeError(f"instances {lost} died during their weight update (the next update restarts the "
                               f"instances)")
        if len(versions) != 1:
            raise RuntimeError(f"instances ended on different weight versions {versions}")
        return versions.pop()

    @staticmethod
    def _await_weights(iid: int, p: WorkerProxy) -> int:
        while True:
            try:
                if not p.conn.poll(READY_TIMEOUT_S):
                    raise RuntimeError(f"instance {iid} did not finish its weight update within "
                                       f"{READY_TIMEOUT_S:.0f} s")
                msg = p.conn.recv()
            except (EOFError, OSError) as err:
                raise RuntimeError(f"instance {iid} died during its weight update (the next update restarts "
                                   f"the instances)") from err
            if msg[0] == "error":
                raise RuntimeError(f"instance {iid} failed its weight update:\n{msg[1]}")
            if msg[0] == "weights":
                p.snap["weight_version"] = msg[1]
                return int(msg[1])

    def _measure_cost(self) -> VerifyCostModel:
        return profile_here(self.engine)

    # ------------------------------------------------------------------ live rollout
    def _prepare(self, policy: RolloutPolicy) -> tuple[list[Instance], BroadcastDrafts | None]:
        self._spawn(policy)
        for p in self.proxies.values():
            p.conn.send(("begin",))
        return list(self.proxies.values()), BroadcastDrafts(self._finish_group) if policy.speculative else None

    def _finish_group(self, gid: str) -> None:
        for p in self.proxies.values():
            if p.proc.is_alive():
                p.conn.send(("finish_group", gid))

    def _clear_kv(self) -> int:
        return self.pool.clear()

    def _killer(self, instance_id: int) -> Callable[[], None]:
        proc = self.proxies[instance_id].proc

        def kill() -> None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)

        return kill

    def _drive(self, driver: RolloutDriver, policy: RolloutPolicy, fault: FaultPlan | None) -> None:
        proxies = dict(self.proxies)
        if policy.speculative:
            prompts = {str(sp.group_id): sp.prompt_token_ids for sp in driver.specs.values()}
            for p in proxies.values():
                p.conn.send(("register", list(prompts.items())))
        t0 = time.time()
        driver.begin()
        killed = False
        watch = StallWatch(self.config.stall_timeout_s)
        while not driver.done:
            if fault is not None and not killed and time.time() - t0 >= fault.at_s:
                self.kill_instance(fault.instance_id)  # joined, so the loss is noticed at once
                killed = True
            for iid, msg in self._collect(proxies, timeout=min(0.5, watch.left_s())):
                self._on_message(driver, proxies, iid, msg, t0, policy, watch)
            for iid, p in list(proxies.items()):
                if iid in driver.alive and not p.proc.is_alive():
                    driver.now = time.time() - t0
                    driver.on_instance_lost(iid)
            watch.check(driver)

    def _collect(self, proxies: dict[int, WorkerProxy], timeout: float) -> list[tuple[int, tuple]]:
        out = [(iid, m) for iid, p in proxies.items() for m in p.inbox]
        for p in proxies.values():
            p.inbox.clear()
        if out:
            return out
        conns = {p.conn: iid for iid, p in proxies.items() if p.proc.is_alive()}
        for conn in wait(list(conns), timeout=timeout):
            try:
                while conn.poll(0):
                    out.append((conns[conn], conn.recv()))
            except (EOFError, OSError):
                continue
        return out

    def _on_message(self, driver: RolloutDriver, proxies, iid: int, msg: tuple, t0: float, policy,
                    watch: StallWatch) -> None:
        if msg[0] == "error":
            raise RuntimeError(f"instance {iid} failed:\n{msg[1]}")
        if msg[0] != "step" or iid not in driver.alive:
            return
        _, start, end, rep, snap = msg
        proxies[iid].refresh(snap)
        driver.now = end - t0
        if policy.speculative and rep.new_tokens:
            updates = [(str(driver.specs[rid].group_id), str(rid), toks) for rid, toks in rep.new_tokens]
            for other, p in proxies.items():
                if other != iid and other in driver.alive:
                    p.conn.send(("feed", updates))
        rep.duration_s = end - start
        watch.heard(iid, rep)
        driver.on_step(iid, start - t0, rep)
        if rep.stalled and not rep.scheduled_tokens:
            driver.relieve(iid)

    def close_workers(self) -> None:
        for p in self.proxies.values():
            try:
                if p.proc.is_alive():
                    p.conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        for p in self.proxies.values():
            p.proc.join(timeout=10)
            if p.proc.is_alive():
                p.proc.kill()
        self.proxies.clear()

    def close(self) -> None:
        self.close_workers()
        self.pool.close()
