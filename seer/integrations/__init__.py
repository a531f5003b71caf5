"""Bridges from existing RL frameworks to Seer's rollout.

``seer.integrations.verl``: verl's rollout extension points (a custom ``AgentLoopManager`` that hands whole
GRPO batches to Seer, and a ``BaseRollout`` that pushes the trainer's weights into Seer). Nothing here is
imported by Seer itself; each bridge imports its framework lazily, so Seer runs without any of them installed.
"""
