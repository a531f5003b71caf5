"""A backend whose instances run elsewhere, whatever carries its commands: spawn, weights, rollout setup.

Why one class: local processes and Ray actors host the same ``InstanceHost`` and are driven by the same
wall-clock loop (``wall_clock.py``), so what is left to a backend, starting its hosts and restarting them
after a loss, keeping every instance on the same weights, preparing a rollout, is the same too. Subclasses
(``local.py``, ``ray_cluster.py``) only choose the ``Transport`` and the engine configuration.

Hosts are started on the first rollout or weight update, and again when the drafting configuration changes or
an instance was lost (killed, died, silent): new hosts load the checkpoint and then get the last weights pushed,
so a restart never changes the weights a rollout runs with. A weight update that loses an instance is a clear
error, and the next update starts every instance again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from seer.engine.config import EngineConfig
from seer.rollout.backends.base import Backend, BroadcastDrafts, profile_here
from seer.rollout.backends.wall_clock import drive
from seer.rollout.config import RolloutConfig
from seer.rollout.driver import RolloutDriver
from seer.rollout.instances.base import Instance, InstanceLost
from seer.rollout.instances.host import HostSpec
from seer.rollout.instances.remote import RemoteInstanceProxy
from seer.rollout.instances.transport import CALL_TIMEOUT_S, InstanceFailed, InstanceSilent, Transport
from seer.rollout.policies import RolloutPolicy, get_policy
from seer.rollout.types import FaultPlan, RolloutStalled
from seer.spec.policy import VerifyCostModel


class RemoteBackend(Backend):
    def __init__(self, model: str, config: RolloutConfig, engine: EngineConfig, transport: Transport) -> None:
        super().__init__(model, config)
        self.engine = engine
        self.transport = transport
        self.proxies: dict[int, RemoteInstanceProxy] = {}
        self._key: object = "unset"  # the (drafting, engine) configuration the hosts were started with
        self._weights: tuple[Any, int] | None = None  # the last weights pushed, for restarted hosts
        self.after_weights_sent: Callable[[], None] | None = None  # fault injection (seer bench faults)

    # ------------------------------------------------------------------ hosts
    def _spawn(self, policy: RolloutPolicy, force: bool = False) -> None:
        """Hosts for ``policy``: the running ones where they fit it and all are alive, else new ones."""
        spec = self.config.spec if policy.speculative else None
        key = (spec, self.engine)
        if self.proxies and key == self._key and not force and all(map(self.transport.alive, self.proxies)):
            return
        self.proxies = {}  # the transport closes the running hosts before it starts new ones
        profile = self.verify_cost().to_profile() if spec is not None and spec.adaptive else None
        specs = [HostSpec(iid, self.engine, self.transport.shared_pool, spec, profile)
                 for iid in range(self.config.instances)]
        snaps = self.transport.spawn(specs)
        self.proxies = {iid: RemoteInstanceProxy(iid, snap, self.transport, self.config.stall_timeout_s)
                        for iid, snap in snaps.items()}
        self._key = key
        if self._weights is not None:  # new hosts load the checkpoint: give them the weights of this run
            self._push_weights(*self._weights)

    def close_instances(self) -> None:
        self.transport.close()
        self.proxies.clear()

    def close(self) -> None:
        self.close_instances()

    # ------------------------------------------------------------------ weights
    def weight_versions(self) -> list[int]:
        default = self._weights[1] if self._weights is not None else 0
        return [p.snap["weight_version"] for p in self.proxies.values()] or [default]

    def update_weights(self, source: Any, version: int | None = None) -> int:
        """Push new weights to every instance. A lost instance makes this a clear error; the next call starts
        the instances again, reloads the last weights pushed, then pushes the new ones."""
        if not self.proxies or not all(map(self.transport.alive, self.proxies)):
            self._spawn(get_policy("verl"), force=True)
        new = self._push_weights(source, version)
        self._weights = (source, new)
        return new

    def _push_weights(self, source: Any, version: int | None) -> int:
        link = self.transport
        try:
            tickets = {iid: link.send(iid, "update_weights", source, version) for iid in self.proxies}
            if self.after_weights_sent is not None:
                self.after_weights_sent()
            versions = [int(link.answer(ticket, CALL_TIMEOUT_S)) for ticket in tickets.values()]
            # an instance that died right after answering is lost all the same
            snaps = {iid: link.call(iid, "snapshot") for iid in self.proxies}
        except (InstanceLost, InstanceSilent, InstanceFailed) as err:  # restarted with the others next update
            link.kill(err.instance_id)
            raise RuntimeError(f"instance {err.instance_id} was lost during its weight update ({err}); the next "
                               f"update restarts the instances") from err
        for iid, snap in snaps.items():
            self.proxies[iid].refresh(snap)
        if len(set(versions)) != 1:
            raise RuntimeError(f"instances loaded different weight versions: {versions}")
        return versions[0]

    def _measure_cost(self) -> VerifyCostModel:
        return profile_here(self.engine)

    # ------------------------------------------------------------------ rollouts
    def _prepare(self, policy: RolloutPolicy) -> tuple[list[Instance], BroadcastDrafts | None]:
        self._spawn(policy)
        try:
            self._begin()
        except InstanceLost:  # lost since the last rollout: start them again, same weights
            self._spawn(policy, force=True)
            self._begin()
        return list(self.proxies.values()), BroadcastDrafts(self._finish_group) if policy.speculative else None

    def _begin(self) -> None:
        """Per-rollout counters restart on every host (one silent for the stall timeout stalls the rollout);
        answers of steps taken after the last rollout are dropped."""
        tickets = [self.transport.send(iid, "begin") for iid in self.proxies]
        try:
            for ticket in tickets:
                self.transport.answer(ticket, self.config.stall_timeout_s)
        except InstanceSilent as err:
            raise RolloutStalled(f"{err} (stall timeout)") from err
        self.transport.forget_steps()

    def _finish_group(self, gid: str) -> None:
        for iid in self.proxies:
            if self.transport.alive(iid):
                try:
                    self.transport.post(iid, "finish_group", gid)
                except InstanceLost:
                    pass  # noticed by the drive loop

    def _drive(self, driver: RolloutDriver, policy: RolloutPolicy, fault: FaultPlan | None) -> None:
        drive(driver, self.transport, dict(self.proxies), policy, self.config.stall_timeout_s, fault,
              self.kill_instance)
        for iid in set(self.proxies) - driver.alive:  # the driver gave up on it: start it again next time
            self.transport.lost.add(iid)

    def _killer(self, instance_id: int) -> Callable[[], None]:
        return lambda: self.transport.kill(instance_id)

    def _clear_kv(self) -> int:
        return self.transport.clear_kv()

    def kv_entries(self) -> int:
        return self.transport.kv_entries()
