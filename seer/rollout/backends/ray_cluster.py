"""Instances as Ray actors: the multi-node path.

Each actor runs an ``InstanceHost`` (``instances/host.py``, the same host as an instance process) and answers
one command per actor call; this module is its transport. The coordinator keeps one ``step`` call in flight
per actor with work and reacts to whichever finishes first (``ray.wait``), so instances on different machines
run in parallel. Between actors, KV moves through the Ray object store: an eviction's answer brings the KV
back, it is put in the store, and the actor that resumes the request receives the object reference with the
chunk. Actors are spread over the cluster's nodes (``SPREAD``) and each reports its node id, which the
rollout's per-instance stats carry. Every ``ray.get`` has a timeout and the drive loop's stall watch ends a
rollout in which no actor makes progress, so a lost or silent actor is reported (its requests continue
elsewhere) instead of hanging the rollout. Ray is imported only when this backend is made.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from seer.rollout.backends.remote import RemoteBackend
from seer.rollout.config import RolloutConfig
from seer.rollout.instances.base import InstanceLost
from seer.rollout.instances.host import HostSpec, InstanceHost, KVEntry, StepAnswer
from seer.rollout.instances.transport import CALL_TIMEOUT_S, InstanceFailed, InstanceSilent, Transport


class RayHost(InstanceHost):
    """The body of a Ray actor (wrapped with ``ray.remote`` at runtime): a host that names its node."""

    def __init__(self, spec: HostSpec) -> None:
        import ray

        os.environ.setdefault("OMP_NUM_THREADS", str(spec.engine.num_threads or 1))
        super().__init__(spec)
        self.labels["node"] = ray.get_runtime_context().get_node_id()  # the Ray node the instance runs on


class RayTransport(Transport):
    """Ray actors, reached through actor calls; KV between them goes through the object store."""

    def __init__(self, ray: Any, cpus_per_actor: float) -> None:
        super().__init__()
        self.ray = ray
        self.cpus_per_actor = cpus_per_actor
        self.actors: dict[int, Any] = {}
        self.in_flight: dict[Any, int] = {}  # object ref of a step call -> its instance
        self.handoff: dict[int, Any] = {}  # request id -> object ref of its evicted KV (the pool between actors)

    def spawn(self, specs: list[HostSpec]) -> dict[int, dict[str, Any]]:
        ray = self.ray
        self.close()
        self.lost.clear()
        # SPREAD: instances go to different nodes where the cluster has several, so a rollout uses them all
        actor_cls = ray.remote(num_cpus=self.cpus_per_actor, scheduling_strategy="SPREAD")(RayHost)
        self.actors = {spec.instance_id: actor_cls.remote(spec) for spec in specs}
        snaps = {}
        try:
            for iid, actor in self.actors.items():
                try:
                    snaps[iid] = ray.get(actor.handle.remote("snapshot"), timeout=CALL_TIMEOUT_S)
                except ray.exceptions.GetTimeoutError:
                    raise RuntimeError(
                        f"Ray actor for instance {iid} did not start within {CALL_TIMEOUT_S:.0f} s: the cluster may "
                        f"lack {self.cpus_per_actor} free CPUs for it (SEER_RAY_CPUS_PER_ACTOR), or other load "
                        f"starves it (Ray runs workers at a lower priority)") from None
        except BaseException:
            self.close()
            raise
        return snaps

    def kill(self, iid: int) -> None:
        self.ray.kill(self.actors[iid])
        self.lost.add(iid)

    def close(self) -> None:
        for actor in self.actors.values():
            try:
                self.ray.kill(actor)
            except Exception:  # noqa: BLE001 - an actor that is already gone
                pass
        self.actors.clear()
        self.in_flight.clear()

    # ------------------------------------------------------------------ commands
    def post(self, iid: int, command: str, *args: Any) -> None:
        self.actors[iid].handle.remote(command, *args)  # a dead actor's call fails where it is answered

    def send(self, iid: int, command: str, *args: Any) -> tuple[int, Any, str]:
        return iid, self.actors[iid].handle.remote(command, *args), command

    def answer(self, ticket: tuple[int, Any, str], timeout_s: float) -> Any:
        iid, ref, command = ticket
        errors = self.ray.exceptions
        try:
            return self.ray.get(ref, timeout=timeout_s)
        except errors.GetTimeoutError as err:
            raise InstanceSilent(iid, command, timeout_s) from err
        except errors.RayActorError as err:  # the actor died (killed, its node or process lost)
            self.lost.add(iid)
            raise InstanceLost(iid) from err
        except errors.RayTaskError as err:  # the command raised on the host
            raise InstanceFailed(iid, str(err)) from err

    # ------------------------------------------------------------------ steps
    def request_steps(self, iids: Iterable[int]) -> bool:
        busy = set(self.in_flight.values())
        for iid in iids:
            if iid not in busy:
                self.in_flight[self.actors[iid].handle.remote("step")] = iid
        return bool(self.in_flight)

    def poll(self, timeout_s: float) -> list[tuple[int, StepAnswer]]:
        if not self.in_flight:
            return []
        ready, _ = self.ray.wait(list(self.in_flight), num_returns=1, timeout=timeout_s)
        out = []
        for ref in ready:
            iid = self.in_flight.pop(ref)
            try:
                out.append((iid, self.answer((iid, ref, "step"), CALL_TIMEOUT_S)))
            except InstanceLost:
                pass  # recorded as lost: the drive loop reports it
        return out

    def forget_steps(self) -> None:
        self.in_flight.clear()

    # ------------------------------------------------------------------ KV
    def keep_kv(self, request_id: int, kv: KVEntry) -> None:
        self.handoff[request_id] = self.ray.put(kv)

    def claim_kv(self, request_id: int) -> Any:
        return self.handoff.pop(request_id, None)

    def kv_entries(self) -> int:
        return len(self.handoff)

    def clear_kv(self) -> int:
        n = len(self.handoff)
        self.handoff.clear()
        return n


class RayBackend(RemoteBackend):
    def __init__(self, model: str, config: RolloutConfig, pool: Any) -> None:
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
        cpus_per_actor = float(os.environ.get("SEER_RAY_CPUS_PER_ACTOR", "0.5"))
        super().__init__(model, config, config.instance_engine(model, default_threads=1),
                         RayTransport(ray, cpus_per_actor))
