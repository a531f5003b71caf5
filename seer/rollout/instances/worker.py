"""The body of one instance process: an engine instance driven by messages from the coordinator.

Protocol (tuples over a ``multiprocessing`` pipe). Coordinator -> worker: ``("start", ChunkStart, number)``,
``("evict", rid)`` (answered with ``("evicted", rid, bytes)``), ``("release", rid)``, ``("feed", updates)``
(sibling tokens generated on other instances, for the local draft-server replica), ``("finish_group", gid)``,
``("register", [(gid, prompt)])``, ``("update_weights", source, version)`` (answered with ``("weights", version)``),
``("begin",)`` (a rollout starts: per-rollout counters restart), ``("stop",)``.
Worker -> coordinator: ``("ready", snapshot)`` once, then ``("step", start_wall, end_wall, StepReport,
snapshot)`` after every step. The worker steps whenever it has work and blocks on the pipe when idle.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass

from seer.engine.config import EngineConfig


@dataclass(frozen=True)
class WorkerSpec:
    instance_id: int
    engine: EngineConfig                 # this instance's engine, its model set
    pool_dirs: tuple[str, str, int]      # memory dir, spill dir, budget bytes
    spec: object | None                  # SpecConfig when the policy speculates
    cost_profile: dict | None            # verify-cost profile for the adaptive policy


def snapshot(inst) -> dict:
    st = inst.state()
    return {"free_blocks": st.free_blocks, "running": st.running, "max_running": st.max_running,
            "total_blocks": st.total_blocks, "block_size": st.block_size,
            "resident": {rid: inst.resident_blocks(rid) for rid in inst.resident()},
            "has_work": inst.has_work(), "weight_version": inst.weight_version, "stats": inst.stats(),
            "handled": getattr(inst, "handled_starts", 0)}


def _build(spec: WorkerSpec):
    from seer.engine.llm_engine import LLMEngine
    from seer.engine.speculator import Speculator
    from seer.rollout.file_pool import FileKVPool
    from seer.rollout.instances.engine import EngineInstance
    from seer.spec.policy import VerifyCostModel

    engine = LLMEngine(spec.engine.for_instance(spec.instance_id))
    pool = FileKVPool(*spec.pool_dirs)
    speculator = None
    if spec.spec is not None:
        cost = VerifyCostModel.from_profile(spec.cost_profile) if spec.cost_profile is not None else None
        speculator = Speculator.build(spec.spec, cost)
    return EngineInstance(spec.instance_id, engine, pool, speculator)


def _handle(inst, conn, msg) -> bool:
    kind = msg[0]
    if kind == "start":
        inst.start(msg[1])
        inst.handled_starts = msg[2]
    elif kind == "begin":
        inst.begin_rollout()
    elif kind == "evict":
        conn.send(("evicted", msg[1], inst.evict(msg[1])))
    elif kind == "release":
        if str(msg[1]) in inst.scheduler.paused or str(msg[1]) in inst.scheduler.requests:
            inst.release(msg[1])
    elif kind == "feed" and inst.speculator is not None:
        server = inst.speculator.server
        for gid, rid, toks in msg[1]:
            if not server.has_group(gid):
                continue
            server.feed([(gid, rid, toks)])
    elif kind == "register" and inst.speculator is not None:
        server = inst.speculator.server
        for gid, prompt in msg[1]:
            if not server.has_group(gid):
                server.register_group(gid, prompt)
    elif kind == "finish_group" and inst.speculator is not None:
        inst.speculator.finish_group(msg[1])
    elif kind == "update_weights":
        conn.send(("weights", inst.update_weights(msg[1], msg[2])))
    elif kind == "stop":
        return False
    return True


def worker_main(conn, spec: WorkerSpec) -> None:
    try:
        inst = _build(spec)
        conn.send(("ready", snapshot(inst)))
        while True:
            if not inst.has_work():
                conn.poll(None)
            while conn.poll(0):
                if not _handle(inst, conn, conn.recv()):
                    return
            if inst.has_work():
                t0 = time.time()
                rep = inst.step()
                # the KV moved while handling messages since the last step is part of the busy time
                conn.send(("step", t0 - rep.kv_s, time.time(), rep, snapshot(inst)))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return
    except Exception:
        try:
            conn.send(("error", traceback.format_exc()))
        finally:
            os._exit(1)
