"""Tokenizer and chat template, without transformers.

transformers is a test-only dependency, so the runtime tokenizer is the fast Rust ``tokenizers`` library reading
``tokenizer.json`` directly, plus a small Jinja renderer for the chat template stored in
``tokenizer_config.json`` (or ``chat_template.jinja``, which transformers 5.x writes instead). The renderer
mirrors what HF does (sandboxed environment, ``trim_blocks``/``lstrip_blocks``, ``raise_exception``,
``bos_token``/``eos_token``), so prompts are token-for-token what the model was trained on.

End-of-sequence ids are gathered from every place a checkpoint may declare them (generation_config.json,
config.json, tokenizer_config.json): instruct models often stop on a chat-turn token that only one of them lists.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _RustTokenizer

__all__ = ["Tokenizer"]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """Special tokens in tokenizer_config.json are either a string or an AddedToken dict with ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if isinstance(v, int)]
    return []


def _pick_template(raw: Any) -> str | None:
    """A chat template is a string, or a list of ``{"name", "template"}`` (use ``default``, else the first)."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and raw:
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        chosen = named.get("default") or next(iter(named.values()), None)
        return chosen if isinstance(chosen, str) else None
    return None


class _TemplateError(Exception):
    pass


def _raise_exception(message: str) -> None:
    raise _TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _compile_template(source: str) -> Any:
    """Compile like HF: sandboxed, trim/lstrip blocks, loop controls, ``tojson`` that keeps unicode."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class Tokenizer:
    """Thin wrapper over ``tokenizers.Tokenizer`` with the checkpoint's special tokens and chat template."""

    def __init__(self, backend: _RustTokenizer, *, eos_token_ids: tuple[int, ...], bos_token: str | None,
                 eos_token: str | None, chat_template: str | None, source: str = "<memory>") -> None:
        self._tok = backend
        self.eos_token_ids: tuple[int, ...] = eos_token_ids
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.chat_template = chat_template
        self._source = source
        self._compiled: Any = None

    # ----------------------------------------------------------------------------------------------- loading
    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        """Load ``tokenizer.json`` (+ configs) from an HF model directory."""
        root = Path(path)
        if not root.is_dir():
            raise FileNotFoundError(f"tokenizer directory not found: {root}")
        tok_file = root / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {root} (only fast tokenizers are supported)")
        backend = _RustTokenizer.from_file(str(tok_file))
        tok_cfg = _read_json(root / "tokenizer_config.json")
        bos = _token_text(tok_cfg.get("bos_token"))
        eos = _token_text(tok_cfg.get("eos_token"))
        template = _pick_template(tok_cfg.get("chat_template"))
        jinja_file = root / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        if template is None:
            template = _pick_template(_read_json(root / "chat_template.json").get("chat_template"))
        eos_ids = cls._collect_eos(root, backend, eos)
        return cls(backend, eos_token_ids=eos_ids, bos_token=bos, eos_token=eos, chat_template=template,
                   source=str(root))

    @staticmethod
    def _collect_eos(root: Path, backend: _RustTokenizer, eos_text: str | None) -> tuple[int, ...]:
        ids: list[int] = []
        ids += _as_id_list(_read_json(root / "generation_config.json").get("eos_token_id"))
        ids += _as_id_list(_read_json(root / "config.json").get("eos_token_id"))
        if eos_text is not None:
            tid = backend.token_to_id(eos_text)
            if tid is not None:
                ids.append(int(tid))
        return tuple(dict.fromkeys(ids))  # union, first-seen order

    # ------------------------------------------------------------------------------------------- properties
    @property
    def vocab_size(self) -> int:
        """Number of tokens including added special tokens."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    # ---------------------------------------------------------------------------------------- encode/decode
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ---------------------------------------------------------------------------------------- chat template
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = True, **kwargs: Any) -> list[int] | str:
        """Render ``messages`` with the checkpoint's template; token ids (default) or the prompt string.

        The rendered text already contains any BOS the template writes, so tokenizing adds no special tokens.
        Extra keyword arguments (e.g. ``enable_thinking``) are passed to the template as variables.
        """
        if self.chat_template is None:
            raise ValueError(f"tokenizer at {self._source} has no chat template (tokenizer_config.json "
                             "'chat_template' or chat_template.jinja); pass raw prompts or token ids instead")
        if self._compiled is None:
            self._compiled = _compile_template(self.chat_template)
        variables = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or "", **kwargs}
        try:
            text = self._compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **variables)
        except _TemplateError as e:
            raise ValueError(f"chat template rejected the messages: {e}") from e
        return self.encode(text, add_special_tokens=False) if tokenize else text
