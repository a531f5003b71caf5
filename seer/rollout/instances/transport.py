"""How the coordinator reaches instance hosts that run elsewhere: the one thing local processes and Ray actors
do differently.

Why an interface: the wall-clock drive loop (``backends/wall_clock.py``), the instance proxies
(``instances/remote.py``) and the spawn and weight handling (``backends/remote.py``) are written once over it,
so processes and actors cannot drift apart; a transport only says how hosts (``instances/host.py``) are
spawned, how a command reaches one (``post``: no answer wanted; ``send`` then ``answer``: an answer within a
timeout), how step answers come back (``request_steps`` then ``poll``), and how a host is killed.

Failures have one vocabulary whatever the transport: a host that is gone raises ``InstanceLost`` (and is
remembered as lost, so ``alive`` says so from then on), one that does not answer in time ``InstanceSilent``,
and one whose command raised ``InstanceFailed``, with the host's traceback.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any

from seer.rollout.instances.host import HostSpec, KVEntry, StepAnswer

CALL_TIMEOUT_S = 600.0  # starting a host, loading weights: a host silent this long is reported, never waited on


class InstanceSilent(RuntimeError):
    """An instance did not answer a command within its timeout (it may still be alive)."""

    def __init__(self, instance_id: int, command: str, timeout_s: float) -> None:
        super().__init__(f"instance {instance_id} did not answer {command!r} within {timeout_s:g} s")
        self.instance_id = instance_id


class InstanceFailed(RuntimeError):
    """A command raised on its host (a bug, not a loss): the host's traceback, under the instance's name."""

    def __init__(self, instance_id: int, detail: str) -> None:
        super().__init__(f"instance {instance_id} failed:\n{detail}")
        self.instance_id = instance_id


class Transport(abc.ABC):
    """Commands to instance hosts and their answers, for one set of hosts at a time (``spawn`` replaces it)."""

    # a file pool all hosts share (memory dir, spill dir, budget), or None: evicted KV travels with the answer
    shared_pool: tuple[str, str, int] | None = None

    def __init__(self) -> None:
        self.lost: set[int] = set()  # hosts known to be gone (died, killed, or lost a command's answer)

    # ------------------------------------------------------------------ hosts
    @abc.abstractmethod
    def spawn(self, specs: list[HostSpec]) -> dict[int, dict[str, Any]]:
        """Start one host per spec (the current ones are closed first); returns each one's first snapshot.
        A host that does not start within ``CALL_TIMEOUT_S`` is a ``RuntimeError`` naming it."""

    def alive(self, iid: int) -> bool:
        """Whether host ``iid`` is (as far as this side can tell) still there."""
        return iid not in self.lost and self._running(iid)

    def _running(self, iid: int) -> bool:
        """A liveness check of the host itself, where the transport has one (a process)."""
        return True

    @abc.abstractmethod
    def kill(self, iid: int) -> None:
        """Kill host ``iid`` now (fault injection, or a host given up on); it counts as lost."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every host."""

    # ------------------------------------------------------------------ commands
    @abc.abstractmethod
    def post(self, iid: int, command: str, *args: Any) -> None:
        """Deliver a command whose answer is not wanted; ``InstanceLost`` where the host is gone already.
        Commands to one host are handled in the order they were posted or sent."""

    @abc.abstractmethod
    def send(self, iid: int, command: str, *args: Any) -> Any:
        """Deliver a command whose answer is wanted; returns the ticket to ``answer`` it."""

    @abc.abstractmethod
    def answer(self, ticket: Any, timeout_s: float) -> Any:
        """The answer of a command ``send`` delivered (see the module docstring for failures)."""

    def call(self, iid: int, command: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        return self.answer(self.send(iid, command, *args), timeout_s)

    # ------------------------------------------------------------------ steps
    @abc.abstractmethod
    def request_steps(self, iids: Iterable[int]) -> bool:
        """Make sure each host in ``iids`` (those with work) will answer a step; returns whether any step answer
        may still come (False: no host is stepping, so waiting could only end in the stall timeout)."""

    @abc.abstractmethod
    def poll(self, timeout_s: float) -> list[tuple[int, StepAnswer]]:
        """Step answers that arrived, waiting up to ``timeout_s`` for the first; a host found gone meanwhile is
        recorded as lost (``alive``)."""

    @abc.abstractmethod
    def forget_steps(self) -> None:
        """A rollout starts: step answers of the one before, still in flight or unread, are not its own."""

    # ------------------------------------------------------------------ KV between hosts
    def keep_kv(self, request_id: int, kv: KVEntry) -> None:
        """KV an eviction's answer brought back: hold it for the host that resumes the request."""
        raise RuntimeError("hosts that share a pool never send KV back")

    def claim_kv(self, request_id: int) -> Any:
        """What a chunk start carries to its host: the request's held KV (taken), or None."""
        return None

    @abc.abstractmethod
    def kv_entries(self) -> int:
        """KV entries held between hosts (pool files or held KV)."""

    @abc.abstractmethod
    def clear_kv(self) -> int:
        """Drop every KV entry held between hosts; returns how many there were."""
