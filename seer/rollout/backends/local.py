"""Instances as separate processes on this machine: real parallelism, wall-clock time.

Each instance process runs an ``InstanceHost`` (``instances/host.py``) with its own torch threads (one each by
default, so two instances use the two cores of a small machine). This module is its transport, both ends of
one ``multiprocessing`` pipe per process: the coordinator sends ``(seq, command, args)`` (``seq`` None when no
answer is wanted), the process answers ``("answer", seq, result)``, and sends ``("step", StepAnswer)`` after
every step it takes on its own (it steps whenever it has work and blocks on the pipe when idle), ``("ready",
snapshot)`` once at start and ``("error", traceback)`` before it exits on a bug. KV moves between instances
through a file-backed pool in shared memory that every process opens. A process that dies is noticed (its pipe
reads EOF, or the process is no longer alive), and its requests continue elsewhere.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from collections.abc import Iterable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from seer.rollout.backends.remote import RemoteBackend
from seer.rollout.config import RolloutConfig
from seer.rollout.file_pool import FileKVPool
from seer.rollout.instances.base import InstanceLost
from seer.rollout.instances.host import HostSpec, InstanceHost, StepAnswer
from seer.rollout.instances.transport import CALL_TIMEOUT_S, InstanceFailed, InstanceSilent, Transport


def serve(conn: Connection, spec: HostSpec) -> None:
    """The body of an instance process: its host answers commands between the steps it takes."""
    try:
        host = InstanceHost(spec)
        conn.send(("ready", host.snapshot()))
        while True:
            if not host.has_work():
                conn.poll(None)
            while conn.poll(0):
                seq, command, args = conn.recv()
                if command == "stop":
                    return
                result = host.handle(command, *args)
                if seq is not None:
                    conn.send(("answer", seq, result))
            if host.has_work():
                conn.send(("step", host.step()))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return
    except Exception:
        try:
            conn.send(("error", traceback.format_exc()))
        finally:
            os._exit(1)


class PipeTransport(Transport):
    """Instance processes, each reached through its pipe; KV between them goes through ``pool``."""

    def __init__(self, pool: FileKVPool) -> None:
        super().__init__()
        self.ctx = mp.get_context("spawn")
        self.pool = pool
        self.shared_pool = (str(pool.memory_dir), str(pool.spill_dir), pool.budget_bytes)
        self.procs: dict[int, BaseProcess] = {}
        self.conns: dict[int, Connection] = {}
        self.steps: list[tuple[int, StepAnswer]] = []  # step answers read, not yet polled
        self.answers: dict[tuple[int, int], Any] = {}  # (instance, seq) -> answer read before it was asked for
        self.seq = 0

    def spawn(self, specs: list[HostSpec]) -> dict[int, dict[str, Any]]:
        self.close()
        self.lost.clear()
        try:
            for spec in specs:
                parent, child = self.ctx.Pipe()
                proc = self.ctx.Process(target=serve, args=(child, spec), daemon=True,
                                        name=f"seer-instance-{spec.instance_id}")
                proc.start()
                child.close()  # the process holds its end: when it dies, this end reads EOF at once
                self.procs[spec.instance_id], self.conns[spec.instance_id] = proc, parent
            return {iid: self._ready(iid, conn) for iid, conn in self.conns.items()}
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _ready(iid: int, conn: Connection) -> dict[str, Any]:
        try:
            if not conn.poll(CALL_TIMEOUT_S):
                raise RuntimeError(f"instance {iid} did not start within {CALL_TIMEOUT_S:.0f} s")
            msg = conn.recv()
        except (EOFError, OSError) as err:
            raise RuntimeError(f"instance {iid} died while starting") from err
        if msg[0] != "ready":
            raise RuntimeError(f"instance {iid} failed to start:\n{msg[1]}")
        return msg[1]

    def _running(self, iid: int) -> bool:
        return iid in self.procs and self.procs[iid].is_alive()

    def kill(self, iid: int) -> None:
        proc = self.procs[iid]
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)  # joined, so the loss is noticed at once
        self.lost.add(iid)

    def close(self) -> None:
        for iid in self.procs:
            if self._running(iid):
                try:
                    self.conns[iid].send((None, "stop", ()))
                except (BrokenPipeError, OSError):
                    pass
        for proc in self.procs.values():
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        self.procs.clear()
        self.conns.clear()
        self.steps.clear()
        self.answers.clear()

    # ------------------------------------------------------------------ commands
    def _deliver(self, iid: int, msg: tuple[int | None, str, tuple[Any, ...]]) -> None:
        try:
            self.conns[iid].send(msg)
        except (BrokenPipeError, OSError) as err:
            self.lost.add(iid)
            raise InstanceLost(iid) from err

    def post(self, iid: int, command: str, *args: Any) -> None:
        self._deliver(iid, (None, command, args))

    def send(self, iid: int, command: str, *args: Any) -> tuple[int, int, str]:
        self.seq += 1
        self._deliver(iid, (self.seq, command, args))
        return iid, self.seq, command

    def answer(self, ticket: tuple[int, int, str], timeout_s: float) -> Any:
        iid, seq, command = ticket
        conn, deadline = self.conns[iid], time.monotonic() + timeout_s
        try:
            while (iid, seq) not in self.answers:  # step answers that arrive meanwhile are kept for ``poll``
                if conn.poll(min(0.5, max(0.0, deadline - time.monotonic()))):
                    self._read(iid, conn.recv())
                elif not self._running(iid):
                    raise EOFError("the instance process died")
                elif time.monotonic() >= deadline:
                    raise InstanceSilent(iid, command, timeout_s)
        except (EOFError, OSError) as err:  # the process died before answering
            self.lost.add(iid)
            raise InstanceLost(iid) from err
        return self.answers.pop((iid, seq))

    def _read(self, iid: int, msg: tuple[Any, ...]) -> None:
        if msg[0] == "answer":
            self.answers[(iid, msg[1])] = msg[2]
        elif msg[0] == "step":
            self.steps.append((iid, msg[1]))
        elif msg[0] == "error":  # it failed on a bug rather than being killed (and exits): say what happened
            self.lost.add(iid)
            raise InstanceFailed(iid, msg[1])

    # ------------------------------------------------------------------ steps
    def request_steps(self, iids: Iterable[int]) -> bool:
        return True  # a process steps on its own whenever it has work

    def poll(self, timeout_s: float) -> list[tuple[int, StepAnswer]]:
        if not self.steps:
            conns = {iid: conn for iid, conn in self.conns.items() if self.alive(iid)}
            ready = wait(list(conns.values()), timeout=timeout_s)
            for iid, conn in conns.items():
                try:
                    while conn in ready and conn.poll(0):
                        self._read(iid, conn.recv())
                except (EOFError, OSError):
                    self.lost.add(iid)
        out, self.steps = self.steps, []
        return out

    def forget_steps(self) -> None:
        self.steps.clear()

    # ------------------------------------------------------------------ KV
    def kv_entries(self) -> int:
        return self.pool.stats().entries

    def clear_kv(self) -> int:
        return self.pool.clear()


class ProcessBackend(RemoteBackend):
    def __init__(self, model: str, config: RolloutConfig, pool: Any) -> None:
        if config.instances > (os.cpu_count() or 1):
            raise ValueError(f"{config.instances} instances need at least as many cores; this machine has "
                             f"{os.cpu_count()} (use --backend inprocess or ray for more)")
        engine = config.instance_engine(model, default_threads=config.process_threads())
        self.pool = FileKVPool.create(int(config.pool_budget_gb * 2**30), config.spill_dir)
        super().__init__(model, config, engine, PipeTransport(self.pool))

    def close(self) -> None:
        super().close()
        self.pool.close()
