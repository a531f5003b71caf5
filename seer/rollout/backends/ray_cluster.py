"""Instances as Ray actors: the multi-node path.

Each actor owns one engine instance (the same ``EngineInstance`` as the other backends) and runs one step per
``step`` call; the coordinator keeps one step call in flight per actor with work and reacts to whichever
finishes first (``ray.wait``), so instances on different machines run in parallel. Between actors, KV moves
through the Ray object store: evicting returns the KV as an object, and the actor that resumes the request
receives the object reference with the chunk. Actors are spread over the cluster's nodes (``SPREAD``) and each
reports its node id, which the rollout's per-instance stats carry. Every ``ray.get`` has a timeout and a
``StallWatch`` ends a rollout in which no actor makes progress, so a lost or silent actor is reported (its
requests continue elsewhere) instead of hanging the rollout.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from seer.rollout.backends.base import Backend, BroadcastDrafts, profile_here
from seer.rollout.driver import RolloutDriver
from seer.rollout.instances.base import ChunkStart, Instance, InstanceLost
from seer.rollout.instances.remote import RemoteInstanceProxy
from seer.rollout.instances.worker import WorkerSpec, snapshot
from seer.rollout.kv_pool import KVPool, PoolStats
from seer.rollout.policies import RolloutPolicy, get_policy
from seer.rollout.stall import StallWatch
from seer.rollout.types import FaultPlan, RolloutStalled
from seer.spec.policy import VerifyCostModel

CALL_TIMEOUT_S = 600.0


class HandoffPool(KVPool):
    """An actor-local pool: entries arrive with a chunk (from the object store) or leave on eviction."""

    def __init__(self) -> None:
        self.entries: dict = {}
        self.moved = 0

    def put(self, request_id, payload, meta=None) -> None:
        self.entries[request_id] = (payload, meta or {})
        self.moved += len(payload)

    def get(self, request_id):
        return self.entries[request_id]

    def pop(self, request_id):
        return self.entries.pop(request_id)

    def drop(self, request_id) -> bool:
        return self.entries.pop(request_id, None) is not None

    def clear(self) -> int:
        n = len(self.entries)
        self.entries.clear()
        return n

    def contains(self, request_id) -> bool:
        return request_id in self.entries

    def stats(self) -> PoolStats:
        size = sum(len(p) for p, _ in self.entries.values())
        return PoolStats(len(self.entries), size, 0, self.moved, 0, 0, 0)

    def check_integrity(self) -> None:
        assert all(isinstance(m, dict) for _, m in self.entries.values())

    def close(self) -> None:
        self.entries.clear()


class InstanceActor:
    """The body of a Ray actor (wrapped with ``ray.remote`` at runtime)."""

    def __init__(self, spec: WorkerSpec) -> None:
        from seer.rollout.instances.worker import _build

        os.environ.setdefault("OMP_NUM_THREADS", str(spec.engine.num_threads or 1))
        self.inst = _build(spec)
        self.inst.pool = HandoffPool()

    def snapshot(self) -> dict:
        import ray

        return dict(snapshot(self.inst), node=ray.get_runtime_context().get_node_id())

    def start(self, chunk: ChunkStart, number: int, kv=None) -> None:
        if kv is not None:
            self.inst.pool.put(chunk.spec.request_id, kv[0], kv[1])
        self.inst.start(chunk)
        self.inst.handled_starts = number

    def begin(self) -> None:
        self.inst.begin_rollout()

    def step(self):
        if not self.inst.has_work():
            return None
        t0 = time.time()
        rep = self.inst.step()
        # the KV this actor moved since its last step (evict and start calls) is part of its busy time
        return t0 - rep.kv_s, time.time(), rep, self.snapshot()

    def evict(self, request_id: int):
        nbytes = self.inst.evict(request_id)
        return nbytes, self.inst.pool.pop(request_id)

    def release(self, request_id: int) -> None:
        if str(request_id) in self.inst.scheduler.paused:
            self.inst.release(request_id)

    def register(self, groups) -> None:
        if self.inst.speculator is not None:
            server = self.inst.speculator.server
            for gid, prompt in groups:
                if not server.has_group(gid):
                    server.register_group(gid, prompt)

    def feed(self, updates) -> None:
        if self.inst.speculator is not None:
            server = self.inst.speculator.server
            server.feed([u for u in updates if server.has_group(u[0])])

    def finish_group(self, gid: str) -> None:
        if self.inst.speculator is not None:
            self.inst.speculator.finish_group(gid)

    def update_weights(self, source, version):
        return self.inst.update_weights(source, version)


class ActorProxy(RemoteInstanceProxy):
    """A Ray actor; evicted KV travels as an object reference to whichever actor resumes the request."""

    def __init__(self, iid: int, actor, snap: dict, handoff: dict[int, object]) -> None:
        super().__init__(iid, snap)
        self.actor = actor
        self.handoff_source = handoff  # request id -> object ref of its evicted KV, shared by all proxies

    def send_start(self, chunk: ChunkStart, number: int) -> None:
        self.actor.start.remote(chunk, number, self.handoff_source.pop(chunk.spec.request_id, None))

    def evict(self, request_id: int) -> int:
        import ray

        blocks = self.forget_resident(request_id)
        try:
            nbytes, kv = ray.get(self.actor.evict.remote(request_id), timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
            raise InstanceLost(self.instance_id) from err
        self.handoff_source[request_id] = ray.put(kv)
        self.snap["free_blocks"] += blocks
        return int(nbytes)

    def release(self, request_id: int) -> None:
        self.forget_resident(request_id)
        self.actor.release.remote(request_id)

    def stats(self) -> dict:
        return dict(super().stats(), node=self.snap.get("node"))  # the Ray node the instance runs on


class RayBackend(Backend):
    def __init__(self, model: str, config, pool) -> None:
        super().__init__(model, config)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # read at import: keeps Ray on loopback
        try:
            import ray
        except ImportError as err:
            raise ValueError("backend 'ray' needs Ray: pip install 'ray==2.60.0'") from err
        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS")
            if address:
                ray.init(address=address)
            else:  # a runtime of our own: this machine only, reachable from nowhere else
                ray.init(num_cpus=os.cpu_count(), include_dashboard=False, ignore_reinit_error=True,
                         _node_ip_address="127.0.0.1")
        self.ray = ray
        self.engine = config.instance_engine(model, default_threads=1)
        self.cpus_per_actor = float(os.environ.get("SEER_RAY_CPUS_PER_ACTOR", "0.5"))
        self.proxies: dict[int, ActorProxy] = {}
        self.handoff: dict[int, object] = {}  # request id -> object ref of its evicted KV (the pool between actors)
        self._key: object = "unset"
        self._weights: tuple[object, int] | None = None  # the last weights pushed, for restarted actors
        self._lost = False  # an actor died: the next rollout or weight update starts them all again
        self.after_weights_sent: Callable[[], None] | None = None  # fault injection (seer bench faults)

    def _spawn(self, policy: RolloutPolicy, force: bool = False) -> None:
        ray = self.ray
        spec = self.config.spec if policy.speculative else None
        if self.proxies and self._key == spec and not force:
            return
        self.close_actors()
        profile = self.verify_cost().to_profile() if spec is not None and spec.adaptive else None
        # SPREAD: instances go to different nodes where the cluster has several, so a rollout uses them all
        actor_cls = ray.remote(num_cpus=self.cpus_per_actor, scheduling_strategy="SPREAD")(InstanceActor)
        handoff = self.handoff
        for iid in range(self.config.instances):
            ws = WorkerSpec(iid, self.engine, ("", "", 0), spec, profile)
            actor = actor_cls.remote(ws)
            try:
                snap = ray.get(actor.snapshot.remote(), timeout=CALL_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                raise RuntimeError(
                    f"Ray actor for instance {iid} did not start within {CALL_TIMEOUT_S:.0f} s: the cluster may lack "
                    f"{self.cpus_per_actor} free CPUs for it (SEER_RAY_CPUS_PER_ACTOR), or other load starves it "
                    f"(Ray runs workers at a lower priority)") from None
            self.proxies[iid] = ActorProxy(iid, actor, snap, handoff)
        self._key = spec
        if self._weights is not None:  # new actors load the checkpoint: give them the weights of this run
            self._push_weights(*self._weights)

    def weight_versions(self) -> list[int]:
        default = self._weights[1] if self._weights is not None else 0
        return [p.snap["weight_version"] for p in self.proxies.values()] or [default]

    def update_weights(self, source, version: int | None = None) -> int:
        """Push new weights to every actor. A lost actor makes this a clear error; the next call starts the
        actors again, reloads the last weights pushed, then pushes the new ones."""
        if not self.proxies or self._lost:
            self._spawn(get_policy("verl"), force=True)
        new = self._push_weights(source, version)
        self._weights = (source, new)
        return new

    def _push_weights(self, source, version: int | None) -> int:
        ray = self.ray
        refs = [p.actor.update_weights.remote(source, version) for p in self.proxies.values()]
        if self.after_weights_sent is not None:
            self.after_weights_sent()
        try:
            versions = list(ray.get(refs, timeout=CALL_TIMEOUT_S))
            # an actor that died right after answering is lost all the same
            ray.get([p.actor.snapshot.remote() for p in self.proxies.values()], timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
            self._lost = True
            raise RuntimeError(f"an instance was lost during its weight update ({type(err).__name__}); the "
                               f"next update restarts the instances") from err
        for p, v in zip(self.proxies.values(), versions):  # one version per actor, in the proxies' order
            p.snap["weight_version"] = v
        if len(set(versions)) != 1:
            raise RuntimeError(f"instances loaded different weight versions: {versions}")
        self._lost = False
        return versions[0]

    def _measure_cost(self) -> VerifyCostModel:
        return profile_here(self.engine)

    def _prepare(self, policy: RolloutPolicy) -> tuple[list[Instance], BroadcastDrafts | None]:
        ray = self.ray
        self._spawn(policy, force=self._lost)
        try:
            ray.get([p.actor.begin.remote() for p in self.proxies.values()], timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayActorError:  # lost since the last rollout: start them again, same weights
            self._spawn(policy, force=True)
            ray.get([p.actor.begin.remote() for p in self.proxies.values()], timeout=CALL_TIMEOUT_S)
        return list(self.proxies.values()), BroadcastDrafts(self._finish_group) if policy.speculative else None

    def _finish_group(self, gid: str) -> None:
        for p in self.proxies.values():
            p.actor.finish_group.remote(gid)

    def _clear_kv(self) -> int:
        n = len(self.handoff)
        self.handoff.clear()
        return n

    def _killer(self, instance_id: int) -> Callable[[], None]:
        actor = self.proxies[instance_id].actor
        return lambda: self.ray.kill(actor)


    def _drive(self, driver: RolloutDriver, policy: RolloutPolicy, fault: FaultPlan | None) -> None:
        ray, proxies = self.ray, dict(self.proxies)
        if policy.speculative:
            prompts = [(str(sp.group_id), sp.prompt_token_ids) for sp in driver.specs.values()]
            ray.get([p.actor.register.remote(prompts) for p in proxies.values()], timeout=CALL_TIMEOUT_S)
        t0 = time.time()
        driver.begin()
        in_flight: dict[object, int] = {}
        killed = False
        watch = StallWatch(self.config.stall_timeout_s)
        while not driver.done:
            if fault is not None and not killed and time.time() - t0 >= fault.at_s:
                self.kill_instance(fault.instance_id)
                killed = True
            for iid in sorted(driver.alive):
                if iid not in in_flight.values() and proxies[iid].has_work():
                    in_flight[proxies[iid].actor.step.remote()] = iid
            if not in_flight:
                raise RolloutStalled(driver.diagnose())
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=watch.left_s())
            if ready:
                iid = in_flight.pop(ready[0])
                self._on_step(driver, proxies, iid, ready[0], t0, policy, watch)
            watch.check(driver)
        self._lost = self._lost or driver.alive != set(proxies)

    def _on_step(self, driver: RolloutDriver, proxies: dict[int, ActorProxy], iid: int, ref: object, t0: float,
                 policy: RolloutPolicy, watch: StallWatch) -> None:
        """One actor's step came back: its report goes to the driver, its new tokens to the other replicas."""
        ray = self.ray
        try:
            out = ray.get(ref, timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError):
            driver.now = time.time() - t0
            driver.on_instance_lost(iid)
            return
        if out is None:
            proxies[iid].snap["has_work"] = False
            return
        start, end, rep, snap = out
        proxies[iid].refresh(snap)
        driver.now = end - t0
        if policy.speculative and rep.new_tokens:
            updates = [(str(driver.specs[r].group_id), str(r), toks) for r, toks in rep.new_tokens]
            for other in driver.alive - {iid}:
                proxies[other].actor.feed.remote(updates)
        rep.duration_s = end - start
        watch.heard(iid, rep)
        driver.on_step(iid, start - t0, rep)
        if rep.stalled and not rep.scheduled_tokens:
            driver.relieve(iid)

    def close_actors(self) -> None:
        for p in self.proxies.values():
            try:
                self.ray.kill(p.actor)
            except Exception:  # noqa: BLE001 - an actor that is already gone
                pass
        self.proxies.clear()

    def close(self) -> None:
        self.close_actors()
