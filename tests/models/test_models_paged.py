"""Paged forward against transformers: chunked prefill + decode over shuffled blocks, trees, greedy decoding.

Every check runs on both attention paths: the C kernel (``kernel``) and the PyTorch fallback (``torch``).
"""

from __future__ import annotations

import pytest
import torch

from seer.models import attn_kernel
from seer.models.attention import AttentionMetadata
from seer.models.attn_plan import SHORT_QUERY_MAX
from seer.models.paged_attention import paged_attention
from tests.models.helpers import FAMILIES, PagedRunner, greedy_paged

TOL = 1e-4
PATHS = [pytest.param(True, id="kernel"), pytest.param(False, id="torch")]


@pytest.fixture(autouse=True)
def _need_kernel(request):
    if "use_kernel" in request.fixturenames and request.getfixturevalue("use_kernel"):
        if not attn_kernel.kernel_available():
            pytest.skip("C attention kernel unavailable (no compiler)")


def _hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_prefill_then_decode(tiny_models, family, use_kernel):
    """3 sequences in one batch; chunks long (SDPA, with and without cached context) and short (kernel)."""
    model, _, hf = tiny_models[family]
    gen = torch.Generator().manual_seed(2)
    prompts = {s: torch.randint(5, 128, (n,), generator=gen).tolist() for s, n in (("a", 41), ("b", 9), ("c", 23))}
    cuts = {"a": 20, "b": 4, "c": 5}  # a: 20 + 21 (both long), b: 4 + 5, c: 5 + 18 (short, then long)
    assert cuts["a"] > SHORT_QUERY_MAX and 41 - cuts["a"] > SHORT_QUERY_MAX
    runner = PagedRunner(model, block_size=4, use_kernel=use_kernel)
    seqs = {s: list(p) for s, p in prompts.items()}
    got = {s: [] for s in prompts}
    for part in (0, 1):
        reqs = [(s, p[: cuts[s]] if part == 0 else p[cuts[s]:]) for s, p in prompts.items()]
        for (s, _), logits in zip(reqs, runner.step(reqs)):
            got[s].append(logits)
    for _ in range(5):
        reqs = [(s, [int(got[s][-1][-1].argmax())]) for s in prompts]
        for (s, toks), logits in zip(reqs, runner.step(reqs)):
            seqs[s] += toks
            got[s].append(logits)
    for s in prompts:
        ours = torch.cat(got[s]).log_softmax(-1)
        ref = _hf_logprobs(hf, seqs[s])
        assert ours.shape == ref.shape
        assert (ours - ref).abs().max() < TOL, s


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("parents", [[-1, 0, 0, 1, 2, -1],  # short tree: kernel path
                                     [-1] + [max(0, j - 3) for j in range(1, 70)]],  # 70 nodes: SDPA path
                         ids=["short", "long"])
def test_tree_verify_equals_chains(tiny_models, use_kernel, parents):
    model, _, _ = tiny_models["qwen3"]
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(5, 128, (10,), generator=gen).tolist()
    tree = torch.randint(5, 128, (len(parents),), generator=gen).tolist()
    runner = PagedRunner(model, num_blocks=2048, block_size=4, use_kernel=use_kernel)
    runner.step([("p", prompt), ("other", prompt[:3])])
    tree_logits = runner.step([("other", [7]), ("p", tree, parents)], commit=False)[1]
    for leaf in range(len(parents)):  # each node's root-to-node chain, run as a plain sequence
        chain = [leaf]
        while parents[chain[-1]] >= 0:
            chain.append(parents[chain[-1]])
        chain.reverse()
        runner.fork("p", ("chain", leaf))
        chain_logits = runner.step([(("chain", leaf), [tree[j] for j in chain])])[0]
        assert (chain_logits[-1] - tree_logits[leaf]).abs().max() < TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_transformers_generate(tiny_models, family):
    model, _, hf = tiny_models[family]
    prompt = torch.randint(5, 128, (13,), generator=torch.Generator().manual_seed(9)).tolist()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)[0, len(prompt):].tolist()
    assert greedy_paged(model, prompt, 20) == ref


def _random_step(dtype: torch.dtype, D: int = 64, bs: int = 16, seed: int = 0):
    """A random decode/verify step over random caches: (q, k, v, caches, meta factory)."""
    gen = torch.Generator().manual_seed(seed)
    H, hkv, nb = 6, 2, 128
    qlens, seqlens = [1, 1, 3, 1, 5], [37, 80, 16, 1, 60]
    T = sum(qlens)
    perm = torch.randperm(nb, generator=gen)
    width = -(-max(seqlens) // bs)
    table = perm[: 5 * width].view(5, width).to(torch.int32)
    slots = []
    for i, (q, s) in enumerate(zip(qlens, seqlens)):
        slots += [int(table[i, p // bs]) * bs + p % bs for p in range(s - q, s)]
    q = torch.randn(T, H, D, generator=gen).to(dtype)
    k, v = torch.randn(T, hkv, D, generator=gen).to(dtype), torch.randn(T, hkv, D, generator=gen).to(dtype)
    kc = torch.randn(nb, bs, hkv, D, generator=gen).to(dtype)
    vc = torch.randn(nb, bs, hkv, D, generator=gen).to(dtype)

    def meta(trees=None):
        return AttentionMetadata(slot_mapping=torch.tensor(slots), query_lens=qlens, seq_lens=seqlens,
                                 block_tables=table, block_size=bs, tree_parents=trees)
    return q, k, v, kc, vc, meta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D,bs", [(64, 16), (128, 16), (48, 8)])  # the kernel's fixed-D paths and its generic one
def test_kernel_agrees_with_torch_path(dtype, D, bs):
    if not attn_kernel.kernel_available():
        pytest.skip("C attention kernel unavailable")
    q, k, v, kc, vc, meta = _random_step(dtype, D, bs)
    trees = [None, None, [-1, 0, 0], None, [-1, -1, 1, 0, 2]]
    outs = []
    for use_kernel in (True, False):
        m = meta(trees)
        m.cache["seer.use_kernel"] = use_kernel
        outs.append(paged_attention(q, k, v, kc.clone(), vc.clone(), m, 0.125).float())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (outs[0] - outs[1]).abs().max() < tol


def test_bad_inputs_raise_clear_errors():
    q, k, v, kc, vc, meta = _random_step(torch.float32)
    with pytest.raises(ValueError, match="parent must precede"):
        paged_attention(q, k, v, kc, vc, meta([None, None, [-1, 2, 0], None, None]), 0.125)
    with pytest.raises(TypeError, match="dtype"):
        paged_attention(q, k, v, kc.to(torch.bfloat16), vc.to(torch.bfloat16), meta(), 0.125)
    bad = meta()
    bad.seq_lens = [37, 80, 16, 1, 600]
    with pytest.raises(ValueError, match="blocks"):
        paged_attention(q, k, v, kc, vc, bad, 0.125)


def test_bf16_paged_agrees_with_dense(tiny_dirs):
    from seer.models.loader import load_model

    model, _ = load_model(tiny_dirs["llama"], dtype=torch.bfloat16)
    prompt = torch.randint(5, 128, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    runner = PagedRunner(model, block_size=16)
    paged = torch.cat(runner.step([("s", prompt[:20])]) + runner.step([("s", prompt[20:])]))
    with torch.no_grad():
        dense = model.compute_logits(model.forward_dense(torch.tensor([prompt])))[0]
    assert paged.dtype == torch.float32
    assert (paged.log_softmax(-1) - dense.log_softmax(-1)).abs().max() < 0.1


def test_allocated_caches_drive_the_model(tiny_models):
    from seer.models.paged_attention import allocate_kv_caches

    model, cfg, hf = tiny_models["llama"]
    caches = allocate_kv_caches(cfg, num_blocks=8, block_size=16, dtype=torch.float32)
    assert len(caches) == cfg.num_hidden_layers and all(k.is_contiguous() and v.is_contiguous() for k, v in caches)
    assert caches[0][0].shape == (8, 16, cfg.num_key_value_heads, cfg.head_dim)
    ids = [5, 9, 17, 33, 65]
    meta = AttentionMetadata(slot_mapping=torch.arange(16, 21), query_lens=[5], seq_lens=[5],
                             block_tables=torch.tensor([[1]]), block_size=16)
    with torch.inference_mode():
        logits = model.compute_logits(model(torch.tensor(ids), torch.arange(5), meta, caches))
    assert (logits.log_softmax(-1) - _hf_logprobs(hf, ids)).abs().max() < TOL
    assert caches[0][0][1, :5].abs().sum() > 0 and caches[0][0][0].abs().sum() == 0
