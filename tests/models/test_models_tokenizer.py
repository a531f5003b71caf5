"""Tokenizer wrapper: encode/decode, EOS union, and HF-identical chat templates."""

from __future__ import annotations

import json

import pytest

from seer.models.tokenizer import Tokenizer
from tests.models.helpers import write_tiny_tokenizer

MESSAGES = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"},
            {"role": "user", "content": "And 4+4?"}]


@pytest.fixture()
def tok_dir(tmp_path):
    write_tiny_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    return tmp_path


def test_encode_decode_roundtrip(tok_dir):
    tok = Tokenizer.from_dir(tok_dir)
    ids = tok.encode("hi there<|im_end|>")
    assert ids[-1] == 4 and len(ids) == len("hi there") + 1
    assert tok.decode(ids) == "hi there"
    assert tok.decode(ids, skip_special_tokens=False) == "hi there<|im_end|>"
    assert tok.vocab_size == 128


def test_eos_ids_union(tok_dir):
    tok = Tokenizer.from_dir(tok_dir)
    assert set(tok.eos_token_ids) == {2, 4}  # config.json 2, generation_config [2, 4], tokenizer <|im_end|> = 4


def test_chat_template_matches_transformers(tok_dir):
    from transformers import AutoTokenizer

    tok = Tokenizer.from_dir(tok_dir)
    hf = AutoTokenizer.from_pretrained(str(tok_dir))
    for gen in (True, False):
        text = tok.apply_chat_template(MESSAGES, add_generation_prompt=gen, tokenize=False)
        assert text == hf.apply_chat_template(MESSAGES, add_generation_prompt=gen, tokenize=False)
        ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=gen)
        assert ids == tok.encode(text)
    assert text.startswith("<|im_start|>system\n")


def test_template_variables_and_raise_exception(tmp_path):
    template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}"
                "{{ raise_exception('tools are not supported') }}{% endif %}{{ m['content'] }}{{ eos_token }}"
                "{% endfor %}")
    write_tiny_tokenizer(tmp_path, chat_template=template)
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "<s>x<|im_end|>"
    with pytest.raises(ValueError, match="tools are not supported"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_chat_template_jinja_file(tmp_path):
    write_tiny_tokenizer(tmp_path, chat_template=None)
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert Tokenizer.from_dir(tmp_path).apply_chat_template(MESSAGES[:1], tokenize=False) == "[What is 2+3?]"


def test_missing_template_and_directory(tmp_path):
    write_tiny_tokenizer(tmp_path, chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer.from_dir(tmp_path).apply_chat_template(MESSAGES)
    with pytest.raises(FileNotFoundError, match="missing"):
        Tokenizer.from_dir(tmp_path / "missing")
