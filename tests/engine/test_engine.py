"""The engine against transformers on the same weights, and its invariants (prefix sharing, preemption,
export/import, seeds, forced replay, bad input)."""

import json
import shutil

import pytest
import torch

from seer import LLM, SamplingParams
from seer.engine.config import EngineConfig
from seer.engine.llm_engine import LLMEngine
from seer.engine.scheduler import RequestRejected

PROMPTS = [[5, 17, 33, 9, 41, 12, 60, 7, 7, 3], [70, 71, 72], list(range(10, 50))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def hf_model(path):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy(model, prompt, max_new, eos):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=eos, pad_token_id=0)
    gen = out[0, len(prompt):].tolist()
    return gen[:gen.index(eos) + 1] if eos in gen else gen


def engine(path, weights_from=None, **kw) -> LLMEngine:
    cfg = dict(model=str(path), dtype="float32", block_size=4, num_kv_blocks=256, max_num_batched_tokens=64)
    cfg.update(kw)
    return LLMEngine(EngineConfig(**cfg), weights_from=weights_from)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_greedy_tokens_and_logprobs_match_transformers(tiny_dirs, family):
    path = tiny_dirs[family]
    llm = LLM(path, dtype="float32", block_size=4, num_kv_blocks=256, max_num_batched_tokens=32)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    ref = hf_model(path)
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == hf_greedy(ref, prompt, 24, eos=2)
        with torch.no_grad():
            full = torch.tensor([prompt + out.token_ids])
            lp = torch.log_softmax(ref(full).logits[0].float(), -1)
        want = [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(out.token_ids)]
        assert max(abs(a - b) for a, b in zip(out.logprobs, want)) < 1e-4


def test_group_prefills_prompt_once(tiny_llama):
    e = engine(tiny_llama)
    prompt = list(range(3, 40))  # 37 tokens: 9 full blocks of 4 + 1
    reqs = [e.add_request(prompt, SamplingParams(temperature=0.8, max_tokens=6, seed=i, ignore_eos=True))
            for i in range(8)]
    e.run_until_done()
    assert e.stats.prompt_tokens_computed == 37 + 7 * 1
    assert all(r.num_output_tokens == 6 for r in reqs)


def run_greedy(e, prompts, max_tokens=30):
    reqs = [e.add_request(p, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
            for p in prompts]
    e.run_until_done()
    return [r.output_token_ids for r in reqs]


def test_preemption_recompute_gives_same_greedy_output(tiny_llama):
    prompts = [[i + 3] * 9 for i in range(6)]
    full = run_greedy(engine(tiny_llama), prompts)
    # 6 requests x 39 tokens need 60 blocks: admitting whatever fits now preempts
    tight = engine(tiny_llama, num_kv_blocks=40, decode_reserve=False)
    assert run_greedy(tight, prompts) == full
    assert tight.stats.preemptions > 0 and tight.stats.reprefill_tokens > 0
    tight.scheduler.check_integrity()
    reserved = engine(tiny_llama, num_kv_blocks=40)  # the default leaves room for max_tokens: no recomputation
    assert run_greedy(reserved, prompts) == full
    assert reserved.stats.preemptions == 0
    reserved.scheduler.check_integrity()


def test_export_import_continues_exactly(tiny_llama):
    prompt = [9, 8, 7, 6, 5, 4, 3, 2, 11, 12, 13]
    want = run_greedy(engine(tiny_llama), [prompt])[0]
    a, b = engine(tiny_llama), engine(tiny_llama)
    req = a.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True), request_id="x")
    for _ in range(8):
        a.step()
    exp = a.export_request("x")
    assert exp.kv is not None and exp.num_computed_tokens == req.num_tokens - 1
    assert a.block_manager.num_free_blocks == a.block_manager.num_blocks
    forward_before = b.runner.forward_tokens
    r2 = b.import_request(exp)
    b.run_until_done()
    assert r2.output_token_ids == want
    steps_after = 30 - len(exp.output_token_ids)
    assert b.runner.forward_tokens - forward_before == steps_after  # one token per step: no re-prefill
    assert a.kv_bytes_moved == exp.kv_bytes == b.kv_bytes_moved > 0


def test_engines_sharing_weights_run_interleaved_and_change_weights_together(tiny_llama):
    prompts = [[i + 3] * 9 for i in range(3)]
    want = run_greedy(engine(tiny_llama), prompts, max_tokens=12)
    a = engine(tiny_llama)
    b = engine(tiny_llama, weights_from=a)
    assert b.model is a.model
    ra = [a.add_request(p, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)) for p in prompts]
    rb = [b.add_request(p, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)) for p in prompts]
    while a.has_unfinished() or b.has_unfinished():  # turns, as in-process instances take them
        a.step()
        b.step()
    assert [r.output_token_ids for r in ra] == want == [r.output_token_ids for r in rb]
    b.add_request(prompts[0], SamplingParams(max_tokens=4))
    with pytest.raises(RuntimeError, match="running"):
        b.weights_changed()
    b.run_until_done()
    assert b.block_manager.find_cached_prefix(b.block_manager.prompt_keys(rb[0]))  # the prompt is cached
    assert a.update_weights({k: v * 1.5 for k, v in a.model.state_dict().items()}) == 1
    assert b.weights_changed(a.weight_version) == 1
    assert not b.block_manager.find_cached_prefix(b.block_manager.prompt_keys(rb[0]))  # old weights' KV dropped
    assert run_greedy(b, prompts, max_tokens=12) == run_greedy(a, prompts, max_tokens=12) != want
    with pytest.raises(ValueError, match="bfloat16"):
        engine(tiny_llama, weights_from=a, dtype="bfloat16", num_kv_blocks=16)


def test_fixed_seed_reproduces_sampling(tiny_llama):
    sp = SamplingParams(n=4, temperature=1.0, top_p=0.9, top_k=50, max_tokens=20, seed=123)
    a = LLM(tiny_llama, dtype="float32").generate([PROMPTS[0]], sp, use_tqdm=False)[0]
    b = LLM(tiny_llama, dtype="float32").generate([PROMPTS[0]], sp, use_tqdm=False)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1  # siblings differ


def test_forced_token_replay_emits_recording(tiny_llama):
    e = engine(tiny_llama)
    forced = [20, 21, 22, 23, 2, 24, 25]  # contains eos (2): replay still emits the whole recording
    r = e.add_request(PROMPTS[1], SamplingParams(temperature=1.0, max_tokens=50), forced_token_ids=forced)
    e.run_until_done()
    assert r.output_token_ids == forced and r.finish_reason == "stop"
    ref = hf_model(tiny_llama)
    with torch.no_grad():
        lp = torch.log_softmax(ref(torch.tensor([PROMPTS[1] + forced])).logits[0].float(), -1)
    want = [lp[len(PROMPTS[1]) - 1 + i, t].item() for i, t in enumerate(forced)]
    assert max(abs(x - y) for x, y in zip(r.output_logprobs, want)) < 1e-4


def test_speculative_verification_is_lossless_greedy(tiny_llama):
    prompts = [PROMPTS[0], PROMPTS[2]]
    want = run_greedy(engine(tiny_llama), prompts, 30)
    e = engine(tiny_llama)
    reqs = [e.add_request(p, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)) for p in prompts]
    step = 0
    while e.has_unfinished():
        for i, r in enumerate(reqs):
            if r.is_finished or r.num_computed_tokens < r.num_prompt_tokens:
                continue
            k = r.num_output_tokens
            truth = want[i][k:k + 5]
            if step % 2:   # chain draft, right for two tokens then wrong
                r.spec_token_ids = truth[:2] + [(t + 1) % 128 for t in truth[2:]]
            else:          # tree draft: a wrong first branch, then the right path
                r.spec_token_ids = [(truth[0] + 3) % 128] + truth[:3] if len(truth) >= 3 else []
                r.spec_parents = [-1, -1, 1, 2] if len(truth) >= 3 else None
        e.step()
        step += 1
    assert [r.output_token_ids for r in reqs] == want
    assert e.stats.spec_accepted > 0


def test_bad_input_errors(tiny_llama, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(tmp_path / "missing")
    bad = tmp_path / "bad"
    shutil.copytree(tiny_llama, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        LLM(bad)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-0.5)
    e = engine(tiny_llama, num_kv_blocks=8, max_model_len=64)
    ok = e.add_request([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=5))
    with pytest.raises(RequestRejected, match="max_model_len"):
        e.add_request([5] * 70, SamplingParams(max_tokens=5))
    with pytest.raises(RequestRejected, match="KV blocks"):
        e.add_request([5] * 10, SamplingParams(max_tokens=40))
    e.run_until_done()
    assert ok.num_output_tokens >= 1 and ok.finish_reason is not None


def test_llm_skip_invalid_keeps_others(tiny_llama):
    llm = LLM(tiny_llama, dtype="float32", max_model_len=64)
    outs = llm.generate([[1, 2, 3], [4] * 80], GREEDY, use_tqdm=False, skip_invalid=True)
    assert outs[0].error is None and len(outs[0].token_ids) > 0
    assert "max_model_len" in outs[1].error and outs[1].outputs == []
    with pytest.raises(ValueError, match="prompt 1"):
        llm.generate([[1, 2, 3], [4] * 80], GREEDY, use_tqdm=False)


def test_grouped_speculation_is_lossless_and_drafts_from_siblings(tiny_llama):
    from seer.engine.speculator import SpecConfig

    prompts = [PROMPTS[0], PROMPTS[2]]
    sp = SamplingParams(n=4, temperature=0.0, max_tokens=30, ignore_eos=True)
    plain = LLM(tiny_llama, dtype="float32", max_num_seqs=2).generate(prompts, sp, use_tqdm=False)
    for k, seqs in ((1, 2), (3, 2), (1, 1)):
        llm = LLM(tiny_llama, dtype="float32", max_num_seqs=seqs,
                  speculative=SpecConfig(k_branches=k, adaptive=False))
        spec = llm.generate(prompts, sp, use_tqdm=False)
        assert [[c.token_ids for c in o.outputs] for o in spec] == [[c.token_ids for c in o.outputs] for o in plain]
        llm.engine.speculator.server.check_integrity()
    # One at a time, siblings 2-4 of each group find their whole (identical greedy) response among the finished
    # ones: each step then accepts 8 drafts + 1 bonus, so at least 2 x 3 x (30 * 8/9 - 8) = 112 accepted.
    assert llm.engine.stats.spec_accepted >= 112


def test_drafts_are_counted_by_source(tiny_llama):
    """A prompt generated again drafts from the kept responses of its first time (the history source), and the
    scheduler counts those drafts apart from the group's own (greedy: the second pass repeats the first, so every
    history draft is accepted)."""
    from seer.engine.speculator import SpecConfig

    sp = SamplingParams(n=1, temperature=0.0, max_tokens=30, ignore_eos=True)
    llm = LLM(tiny_llama, dtype="float32", speculative=SpecConfig(adaptive=False))
    first = llm.generate([PROMPTS[1]], sp, use_tqdm=False)
    stats = llm.engine.stats
    assert stats.history_drafted == 0  # nothing kept yet: any draft came from the response's own stream
    before = (stats.spec_drafted, stats.history_drafted, stats.history_accepted)
    again = llm.generate([PROMPTS[1]], sp, use_tqdm=False)
    assert again[0].outputs[0].token_ids == first[0].outputs[0].token_ids
    drafted, accepted = stats.history_drafted - before[1], stats.history_accepted - before[2]
    assert accepted == drafted >= 20 and stats.spec_drafted - before[0] >= drafted
