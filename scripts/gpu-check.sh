#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py; docs/tests-and-benchmarks.md#the-gpu-check): on a lent GPU machine
# with torch and no internet, from this checkout and a wheelhouse (scripts/offline-wheelhouse.sh, carried as
# .whl/): install, the CUDA tests, the per-arch benchmark in fp16/bf16, 200 updates of umst_base fp32 vs bf16.
# Writes docs/results/gpu-<device>.json and .md (or --out DIR). Two calls: this, then --only compile.
#   bash scripts/gpu-check.sh [--wheelhouse DIR] [--out DIR] [--deadline S] [--only a,b] [--python PY]
#   bash scripts/gpu-check.sh --dry-run     # any machine: plan, fresh-venv install from the wheelhouse, parse checks
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
cd "$ROOT"
exec env PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m benchmarks.gpu_check --python "$PYTHON" "$@"
