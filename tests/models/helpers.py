"""Tiny random-weight HF checkpoints for tests (no downloads).

``make_tiny_model_dir`` builds a transformers model of the requested family, saves it with ``save_pretrained``
(fp32 safetensors, exactly what a real checkpoint looks like) together with a tiny character-level
``tokenizer.json`` and a ChatML chat template, and returns the directory. Engine and RL tests import it, so its
signature is part of the test contract.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

FAMILIES = ("llama", "qwen2", "qwen3")
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")  # ids 0..4
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_config(family: str = "llama", *, vocab_size: int = 128, hidden_size: int = 64, num_layers: int = 2,
                num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 128,
                max_position_embeddings: int = 512, tie_word_embeddings: bool | None = None,
                rope_theta: float = 10000.0):
    """A transformers config object for ``family``; Qwen3 gets an explicit head_dim != hidden/heads."""
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    tie = (family == "qwen2") if tie_word_embeddings is None else tie_word_embeddings
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                  num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                  max_position_embeddings=max_position_embeddings, tie_word_embeddings=tie, rms_norm_eps=1e-6,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  initializer_range=0.15)  # large enough that attention is far from uniform: masks matter
    if family == "llama":
        cfg = transformers.LlamaConfig(**common)
        arch = "LlamaForCausalLM"
    elif family == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        arch = "Qwen2ForCausalLM"
    else:
        cfg = transformers.Qwen3Config(head_dim=2 * hidden_size // num_heads, **common)
        arch = "Qwen3ForCausalLM"
    cfg.rope_parameters = {"rope_theta": rope_theta, "rope_type": "default"}
    cfg.architectures = [arch]
    return cfg


def make_tiny_hf_model(family: str = "llama", seed: int = 0, **config_kwargs):
    """A random-init transformers CausalLM in fp32 eval mode (biases and norms randomised too)."""
    import transformers

    cfg = tiny_config(family, **config_kwargs)
    torch.manual_seed(seed)
    cls = getattr(transformers, cfg.architectures[0])
    model = cls(cfg).to(torch.float32).eval()
    with torch.no_grad():  # default init leaves biases 0 and norms 1: randomise them so they are tested
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def write_tiny_tokenizer(path: Path, vocab_size: int = 128, chat_template: str | None = CHATML_TEMPLATE) -> None:
    """Character-level tokenizer.json over printable ASCII, special tokens first, padded to ``vocab_size``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab: dict[str, int] = {}
    for tok in list(SPECIAL_TOKENS) + chars:
        if len(vocab) < vocab_size:
            vocab[tok] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"<unused{len(vocab)}>"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    tok_cfg: dict = {"bos_token": "<s>", "eos_token": "<|im_end|>", "pad_token": "<pad>",
                     "tokenizer_class": "PreTrainedTokenizerFast"}  # HF then reads tokenizer.json as is
    if chat_template is not None:
        tok_cfg["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 4]}))


def make_tiny_model_dir(tmp_path: Path, family: str = "llama", *, seed: int = 0, with_tokenizer: bool = True,
                        **config_kwargs) -> Path:
    """Save a random tiny ``family`` model (+ tokenizer) under ``tmp_path / f"tiny-{family}"``; return the dir.

    ``config_kwargs`` go to :func:`tiny_config` (vocab_size, hidden_size, num_layers, num_heads, num_kv_heads,
    intermediate_size, max_position_embeddings, tie_word_embeddings, rope_theta).
    """
    model = make_tiny_hf_model(family, seed=seed, **config_kwargs)
    out = Path(tmp_path) / f"tiny-{family}-{seed}"
    model.save_pretrained(str(out), safe_serialization=True)
    if with_tokenizer:
        write_tiny_tokenizer(out, vocab_size=model.config.vocab_size)
    return out


class PagedRunner:
    """Minimal stand-in for the engine: owns paged KV caches and drives ``model.forward`` step by step.

    Blocks are handed out from a shuffled free list, so block tables are non-contiguous like in the engine.
    ``step`` takes, per sequence, its new tokens (and optional tree parents) and returns per-sequence float32
    logits for every new token. ``use_kernel`` None lets the model choose; False forces the PyTorch path.
    """

    def __init__(self, model, num_blocks: int = 128, block_size: int = 4, seed: int = 0,
                 use_kernel: bool | None = None) -> None:
        cfg = model.config
        self.model, self.block_size, self.use_kernel = model, block_size, use_kernel
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        dtype, device = model.dtype, model.device
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype,
                                                                                        device=device))
                          for _ in range(cfg.num_hidden_layers)]
        gen = torch.Generator().manual_seed(seed)
        self.free = torch.randperm(num_blocks, generator=gen).tolist()
        self.blocks: dict[object, list[int]] = {}
        self.lens: dict[object, int] = {}

    def fork(self, src, dst) -> None:
        """``dst`` continues from a copy of ``src``'s KV (blocks copied, so both can diverge)."""
        self.blocks[dst] = []
        self.lens[dst] = 0
        self._reserve(dst, self.lens[src])
        for a, b in zip(self.blocks[src], self.blocks[dst]):
            for k, v in self.kv_caches:
                k[b].copy_(k[a])
                v[b].copy_(v[a])
        self.lens[dst] = self.lens[src]

    def _reserve(self, sid, total: int) -> None:
        blocks = self.blocks.setdefault(sid, [])
        while len(blocks) * self.block_size < total:
            blocks.append(self.free.pop())

    def step(self, requests: list[tuple], commit: bool = True) -> list[torch.Tensor]:
        """requests: (seq_id, new_token_ids) or (seq_id, new_token_ids, tree_parents)."""
        from seer.models.attention import AttentionMetadata
        from seer.models.attn_plan import ancestor_masks

        ids, pos, slots, qlens, slens, trees = [], [], [], [], [], []
        for req in requests:
            sid, toks = req[0], list(req[1])
            parents = req[2] if len(req) > 2 else None
            ctx = self.lens.get(sid, 0)
            self._reserve(sid, ctx + len(toks))
            depth = [m.bit_count() - 1 for m in ancestor_masks(parents, len(toks))]
            for j, tok in enumerate(toks):
                p = ctx + j
                ids.append(tok)
                pos.append(ctx + depth[j])
                slots.append(self.blocks[sid][p // self.block_size] * self.block_size + p % self.block_size)
            qlens.append(len(toks))
            slens.append(ctx + len(toks))
            trees.append(parents)
        width = max(len(self.blocks[r[0]]) for r in requests)
        table = torch.zeros(len(requests), width, dtype=torch.int32)
        for i, req in enumerate(requests):
            table[i, : len(self.blocks[req[0]])] = torch.tensor(self.blocks[req[0]])
        device = self.model.device
        meta = AttentionMetadata(slot_mapping=torch.tensor(slots, device=device), query_lens=qlens,
                                 seq_lens=slens, block_tables=table.to(device), block_size=self.block_size,
                                 tree_parents=trees if any(t is not None for t in trees) else None)
        if self.use_kernel is not None:
            meta.cache["seer.use_kernel"] = self.use_kernel
        with torch.no_grad():
            hidden = self.model(torch.tensor(ids, device=device), torch.tensor(pos, device=device), meta,
                                self.kv_caches)
            logits = self.model.compute_logits(hidden)
        if commit:
            for req, n in zip(requests, qlens):
                self.lens[req[0]] = self.lens.get(req[0], 0) + n
        return list(logits.split(qlens))


def greedy_paged(model, prompt: list[int], max_new_tokens: int, chunk: int = 5, **runner_kwargs) -> list[int]:
    """Greedy decoding with our paged forward: chunked prefill, then one token per step."""
    runner = PagedRunner(model, **runner_kwargs)
    logits = None
    for s in range(0, len(prompt), chunk):
        logits = runner.step([("s", prompt[s: s + chunk])])[0]
    out: list[int] = []
    for _ in range(max_new_tokens):
        tok = int(logits[-1].argmax())
        out.append(tok)
        logits = runner.step([("s", [tok])])[0]
    return out
