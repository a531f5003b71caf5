"""The engine benchmark workload: 32 GSM8K test prompts x n=8, fixed-length and sampled.

Why one module builds it for everyone: Seer, the vLLM peer and the HF peer must run exactly the same prompt
token ids, or the throughput ratios compare different work. So the workload is rendered here once, with the
model's own chat template through our Tokenizer (transformers is not a runtime dependency), and handed to each
peer as a plain JSON-serializable dict:

    {"prompts": [[ids], ...], "n": 8,
     "fixed":   {"max_tokens": 256, "ignore_eos": true, "temperature": 1.0},
     "sampled": {"temperature": 1.0, "max_tokens": 512},
     "source":  {...where the prompts came from...}}

"fixed" (ignore_eos, 256 tokens each) measures raw decode throughput with no length variance; "sampled"
(temperature 1.0, up to 512) is the RL-like case whose long tail Seer targets. The user message is the bare
question; SmolLM2's template then adds its default system prompt, as it would in any chat-template rollout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seer.models.tokenizer import Tokenizer

GSM8K_TEST_FILE = "gsm8k_test.jsonl"
NUM_PROMPTS = 32
N_PER_PROMPT = 8
FIXED_SAMPLING: dict[str, Any] = {"max_tokens": 256, "ignore_eos": True, "temperature": 1.0}
SAMPLED_SAMPLING: dict[str, Any] = {"temperature": 1.0, "max_tokens": 512}
CASES = ("fixed", "sampled")


def default_gsm8k_path() -> Path:
    """The GSM8K test file: packaged under seer/data if installed so, else the repository's data/ folder."""
    package_copy = Path(__file__).resolve().parents[1] / "data" / GSM8K_TEST_FILE
    repo_copy = Path(__file__).resolve().parents[2] / "data" / GSM8K_TEST_FILE
    for candidate in (package_copy, repo_copy):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{GSM8K_TEST_FILE} not found in {package_copy.parent} or {repo_copy.parent}")


def load_gsm8k_questions(path: Path | None = None, limit: int = NUM_PROMPTS) -> list[dict[str, str]]:
    """The first `limit` records of the GSM8K test file as {"id", "question"} dicts, in file order."""
    if limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")
    path = path or default_gsm8k_path()
    records: list[dict[str, str]] = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            if "question" not in record:
                raise ValueError(f"{path}:{line_no}: record has no 'question' key")
            records.append({"id": str(record.get("id", line_no - 1)), "question": record["question"]})
            if len(records) == limit:
                return records
    raise ValueError(f"{path} has only {len(records)} questions, {limit} requested")


def render_prompts(tokenizer: Tokenizer, questions: list[str]) -> list[list[int]]:
    """Each question as one user message, rendered with the chat template + generation prompt, as token ids."""
    prompts: list[list[int]] = []
    for question in questions:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        if not isinstance(ids, list) or not ids:
            raise ValueError(f"chat template rendered no tokens for question {question[:60]!r}")
        prompts.append(ids)
    return prompts


def engine_workload(
    model_dir: Path,
    num_prompts: int = NUM_PROMPTS,
    n: int = N_PER_PROMPT,
    gsm8k_path: Path | None = None,
) -> dict[str, Any]:
    """The `seer bench engine` workload for the model in `model_dir` (its tokenizer and chat template)."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    records = load_gsm8k_questions(gsm8k_path, num_prompts)
    prompts = render_prompts(Tokenizer.from_dir(model_dir), [r["question"] for r in records])
    return {
        "prompts": prompts,
        "n": n,
        "fixed": dict(FIXED_SAMPLING),
        "sampled": dict(SAMPLED_SAMPLING),
        "source": {
            "dataset": "gsm8k_test",
            "ids": [r["id"] for r in records],
            "chat_template": "model default, user message = question",
            "model_dir": str(model_dir),
            "prompt_tokens": sum(len(p) for p in prompts),
        },
    }


def subset(workload: dict[str, Any], num_prompts: int) -> dict[str, Any]:
    """The same workload restricted to its first `num_prompts` prompts (e.g. for a slow peer), marked as such."""
    if not 0 < num_prompts <= len(workload["prompts"]):
        raise ValueError(f"num_prompts must be in 1..{len(workload['prompts'])}, got {num_prompts}")
    smaller = dict(workload)
    smaller["prompts"] = workload["prompts"][:num_prompts]
    source = dict(workload.get("source", {}))
    source["subset_of_prompts"] = f"first {num_prompts} of {len(workload['prompts'])}"
    if "ids" in source:
        source["ids"] = source["ids"][:num_prompts]
    smaller["source"] = source
    return smaller


def validate_workload(workload: dict[str, Any]) -> None:
    """Raise ValueError unless `workload` has the keys and types every peer relies on."""
    prompts = workload.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise ValueError("workload['prompts'] must be a non-empty list of token-id lists")
    for i, p in enumerate(prompts):
        if not isinstance(p, list) or not p or not all(isinstance(t, int) for t in p):
            raise ValueError(f"workload['prompts'][{i}] must be a non-empty list of ints")
    if not isinstance(workload.get("n"), int) or workload["n"] <= 0:
        raise ValueError(f"workload['n'] must be a positive int, got {workload.get('n')!r}")
    for case in CASES:
        settings = workload.get(case)
        if not isinstance(settings, dict) or int(settings.get("max_tokens", 0)) <= 0:
            raise ValueError(f"workload[{case!r}] must be a dict with a positive 'max_tokens'")


def save_workload(workload: dict[str, Any], path: Path) -> None:
    """Write the workload as JSON (what the peer subprocesses read)."""
    validate_workload(workload)
    path.write_text(json.dumps(workload))


def load_workload(path: Path) -> dict[str, Any]:
    """Read and validate a workload JSON."""
    workload = json.loads(path.read_text())
    validate_workload(workload)
    return workload
