"""Every verb that builds engines takes the same engine flags (seer.engine.arguments) and turns them into the same
``EngineConfig``; a verb's own defaults (KV per instance, seeds) stay its own."""

from __future__ import annotations

import argparse

import pytest

from seer.cli.main import build_parser
from seer.cli.serve import build_config
from seer.engine.arguments import engine_config, engine_kwargs
from seer.engine.config import EngineConfig
from seer.rollout.arguments import rollout_config
from seer.rollout.config import default_instance_engine

ENGINE_FLAGS = ["--model", "m", "--dtype", "float32", "--device", "cpu", "--kv-cache-gb", "0.5", "--num-kv-blocks",
                "64", "--block-size", "8", "--max-num-seqs", "7", "--max-num-batched-tokens", "512",
                "--max-model-len", "300", "--no-enable-prefix-caching", "--threads", "2"]
EXPECTED = EngineConfig(dtype="float32", device="cpu", kv_cache_memory_gb=0.5, num_kv_blocks=64, block_size=8,
                        max_num_seqs=7, max_num_batched_tokens=512, max_model_len=300, enable_prefix_caching=False,
                        num_threads=2)
VERBS = {"generate": [], "rollout": ["--trace", "t.jsonl"], "serve": [], "bench rollout": ["--trace", "t.jsonl"]}


def parse(verb: str, *flags: str) -> argparse.Namespace:
    return build_parser().parse_args([*verb.split(), *VERBS[verb], *flags])


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_takes_the_engine_flags(verb: str) -> None:
    args = parse(verb, *ENGINE_FLAGS)
    assert args.model == "m"
    assert engine_config(args) == EXPECTED


def test_each_verb_builds_its_engine_from_them() -> None:
    assert rollout_config(parse("rollout", *ENGINE_FLAGS), "seer").engine == EXPECTED
    assert build_config(parse("serve", *ENGINE_FLAGS, "--seed", "5")).engine == EngineConfig(
        **{**engine_kwargs(parse("serve", *ENGINE_FLAGS)), "seed": 5})
    assert EngineConfig(model="x", **engine_kwargs(parse("generate", *ENGINE_FLAGS))) == EngineConfig(
        **{**EXPECTED.__dict__, "model": "x"})


def test_defaults_are_the_configs() -> None:
    """A plain engine's defaults for ``generate``; the rollout instances' template (less KV each) for the others."""
    assert engine_config(parse("generate")) == EngineConfig()
    for verb in ("rollout", "serve", "bench rollout"):
        assert engine_config(parse(verb)) == default_instance_engine()
    assert parse("generate").seed is None and parse("rollout").seed == 0 and parse("serve").seed == 0
