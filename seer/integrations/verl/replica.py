"""``SeerReplica``: verl's ``RolloutReplica`` for ``rollout.name=seer`` (imports verl).

verl 0.9 builds its rollout replicas in an ``LLMServerManager`` from ``rollout.name`` before the agent loop
manager exists, and its checkpoint manager sleeps / wakes them around every step. Seer is one service outside
verl's GPU pools (``seer serve`` or a Ray actor), reached by ``SeerAgentLoopManager``; each replica is only a
record of where that service is. Nothing is launched, so sleep/wake/abort/profile have nothing to do.

verl's own agent-loop manager would send token-in-token-out requests to a replica's server handle; Seer's
replicas have none, so ``launch_servers`` insists on Seer's manager and says how to set it.
"""

from __future__ import annotations

from verl.workers.rollout.replica import RolloutReplica

from seer.integrations.verl.batching import cfg_get, seer_options

MANAGER_NAME = "SeerAgentLoopManager"


class SeerReplica(RolloutReplica):
    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def init_standalone(self):
        await self.launch_servers()

    async def init_colocated(self, resource_pool):
        await self.launch_servers()

    async def launch_servers(self):
        manager = cfg_get(cfg_get(self.config, "agent"), "agent_loop_manager_class") or ""
        if not str(manager).endswith(MANAGER_NAME):
            raise ValueError("rollout.name=seer runs through Seer's own rollout manager: set "
                             "actor_rollout_ref.rollout.agent.agent_loop_manager_class="
                             "seer.integrations.verl.SeerAgentLoopManager")
        opts = seer_options(self.config)
        self._server_address = opts.get("url") or f"seer-{opts.get('backend', 'inprocess')}"
        self._server_handle = None
        self.servers = []

    async def wake_up(self):
        return None

    async def sleep(self):
        return None

    async def abort_all_requests(self, reject_request: bool = False):
        return None

    async def resume_generation(self):
        return None

    async def resume_all_requests(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None
