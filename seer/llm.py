"""``LLM``: the vLLM-like offline API over one engine instance.

``generate`` takes text prompts, token-id prompts or a mix, one ``SamplingParams`` or one per prompt, expands
``n`` into n sibling requests of one group (so they share the prompt's KV), and returns one ``RequestOutput``
per prompt in input order. Invalid prompts raise before any work starts, or, with ``skip_invalid=True``, come
back with ``.error`` set while the others complete.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from tqdm.auto import tqdm

from seer.engine.config import EngineConfig
from seer.engine.llm_engine import LLMEngine
from seer.engine.request import Request
from seer.engine.speculator import SpecConfig, Speculator
from seer.models.tokenizer import Tokenizer
from seer.outputs import CompletionOutput, RequestOutput
from seer.sampling_params import SamplingParams, sibling_seed

PromptLike = str | list[int] | dict


def make_speculator(engine: LLMEngine, config: SpecConfig) -> Speculator:
    """A speculator over a fresh draft server; adaptive ones get this machine's verify-cost profile."""
    from seer.engine.profiler import profile_verify_cost
    from seer.utils.io import cache_dir

    cost = profile_verify_cost(engine, cache_dir=cache_dir() / "profiles") if config.adaptive else None
    return Speculator.build(config, cost)


class LLM:
    def __init__(self, model: str | Path, dtype: str = "auto", device: str = "cpu",
                 speculative: SpecConfig | None = None, **engine_kwargs) -> None:
        """``speculative``: a ``SpecConfig`` turns on grouped speculative decoding (drafts from sibling
        responses of the same prompt, adaptive draft length from a verify-cost profile of this machine)."""
        path = Path(model)
        if not path.is_dir():
            raise FileNotFoundError(f"model directory {str(path)!r} does not exist "
                                    f"(run `seer models prepare smollm2-135m-instruct` for the default model)")
        self.engine = LLMEngine(EngineConfig(model=str(path), dtype=dtype, device=device, **engine_kwargs))
        self.tokenizer = Tokenizer.from_dir(path)
        self.last_stats: dict = {}
        self._calls = 0
        if speculative is not None:
            self.engine.enable_speculation(make_speculator(self.engine, speculative))

    # ------------------------------------------------------------------ helpers
    def _to_ids(self, prompt: PromptLike) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt), prompt
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return list(prompt["prompt_token_ids"]), prompt.get("prompt")
            if "messages" in prompt:
                return self.tokenizer.apply_chat_template(prompt["messages"], add_generation_prompt=True), None
            if "prompt" in prompt:
                return self.tokenizer.encode(prompt["prompt"]), prompt["prompt"]
            raise ValueError("a dict prompt needs 'prompt_token_ids', 'messages' or 'prompt'")
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return list(prompt), None
        raise ValueError(f"unsupported prompt type {type(prompt).__name__}: pass text, token ids or a dict")

    # ------------------------------------------------------------------ API
    def generate(self, prompts: PromptLike | Sequence[PromptLike],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, skip_invalid: bool = False,
                 forced_token_ids: Sequence[list[int] | None] | None = None) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                 and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        params = self._params_list(sampling_params, len(prompts))
        outputs: list[RequestOutput] = []
        groups: list[list[Request]] = []
        self._calls += 1
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            ids, text = self._to_ids(prompt)
            out = RequestOutput(f"prompt-{i}", ids, text)
            forced = None if forced_token_ids is None else forced_token_ids[i]
            try:
                reqs = [self.engine.make_request(ids, sp.with_seed(sibling_seed(sp.seed, j)),
                                                 group_id=f"g{self._calls}-{i}", forced_token_ids=forced)
                        for j in range(sp.n)]
                reqs[0].probe = True
                for r in reqs:
                    self.engine.scheduler.validate(r)
            except ValueError as err:
                if not skip_invalid:
                    raise ValueError(f"prompt {i}: {err}") from err
                out.error = str(err)
                reqs = []
            outputs.append(out)
            groups.append(reqs)
        for reqs in groups:
            for r in reqs:
                self.engine.scheduler.add_request(r)
        self._run(groups, use_tqdm)
        if self.engine.speculator is not None:
            for reqs in groups:
                if reqs:
                    self.engine.speculator.finish_group(reqs[0].group_id)
        for out, reqs in zip(outputs, groups):
            out.outputs = [self._completion(j, r) for j, r in enumerate(reqs)]
        return outputs

    def chat(self, conversations: list[list[dict]] | list[dict], sampling_params=None, use_tqdm: bool = True,
             **kwargs) -> list[RequestOutput]:
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        return self.generate([{"messages": c} for c in conversations], sampling_params, use_tqdm, **kwargs)

    def update_weights(self, source, version: int | None = None) -> int:
        return self.engine.update_weights(source, version)

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _params_list(sp, n: int) -> list[SamplingParams]:
        if sp is None:
            return [SamplingParams()] * n
        if isinstance(sp, SamplingParams):
            return [sp] * n
        sp = list(sp)
        if len(sp) != n:
            raise ValueError(f"got {len(sp)} SamplingParams for {n} prompts")
        return sp

    def _run(self, groups: list[list[Request]], use_tqdm: bool) -> None:
        total = sum(len(g) for g in groups)
        t0 = time.perf_counter()
        tokens = 0
        steps0 = self.engine.stats.steps
        with tqdm(total=total, disable=not use_tqdm, desc="generate", unit="resp") as bar:
            while self.engine.has_unfinished():
                finished = self.engine.step()
                for r in finished:
                    tokens += r.num_output_tokens
                if finished:
                    bar.update(len(finished))
                    bar.set_postfix(tok_s=f"{tokens / max(time.perf_counter() - t0, 1e-9):.1f}")
        elapsed = time.perf_counter() - t0
        self.last_stats = {"wall_s": elapsed, "output_tokens": tokens, "tok_s": tokens / max(elapsed, 1e-9),
                           "steps": self.engine.stats.steps - steps0}

    def _completion(self, index: int, req: Request) -> CompletionOutput:
        return CompletionOutput(index, list(req.output_token_ids), list(req.output_logprobs),
                                self.tokenizer.decode(req.output_token_ids), req.finish_reason, req.request_id,
                                req.num_cached_prompt_tokens)
