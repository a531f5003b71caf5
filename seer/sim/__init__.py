"""Cluster-scale rollout simulator: the engine's scheduler, block manager, request buffer, orderings and draft
server, driven by a roofline cost model instead of a model (see ``simulate.py``). Never imports torch.

Public API: ``simulate``, ``run_policy``, ``SimConfig`` (simulate.py); ``SimInstance`` (sim_instance.py);
``CostModel``, ``CostConstants``, ``StepSummary`` (cost_model.py); ``calibrate``, ``load_samples``
(calibrate.py); ``preset_workload``, ``trace_workload``, ``Workload``, ``Cluster``, ``PRESETS``
(workloads.py); ``ACCELERATORS``, ``MODELS``, ``InstanceSpec`` (hardware.py); ``preset_setup`` (fitted.py).
"""
