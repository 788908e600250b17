#!/usr/bin/env bash
# The speed table (python -m benchmarks speed-table; docs/performance.md): fairseq-train words/s per arch at
# the recipe's batch per card (38,400 tokens), stock fairseq's --fp16 and --amp, the plugin's transformer and every
# arch in bf16, eager and --compile, the transformer in fp32 --tf32; MFU, GPU busy, peak memory, compile seconds, losses.
# What a lent GPU's first call runs, from this checkout and the wheelhouse carried as .whl/
# (bash scripts/offline-wheelhouse.sh --dest .whl), with no internet: it installs, builds the synthetic corpus of
# WMT14 lengths, compiles the compiled rows (as many at once as the card's memory holds), then trains the rows one
# by one, writing docs/results/gpu-speed-<card>-<commit>.json (and .md) after every row.
#   bash scripts/gpu-speed.sh [--wheelhouse DIR] [--out DIR] [--deadline S] [--commit SHA] [options of speed_table]
#   bash scripts/gpu-speed.sh --tiny --out /tmp/speed    # any machine: the same plan at tiny sizes on the CPU
# The same command run again keeps the rows already done and runs the rest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
ARGS=("$@")
if [ -d "$ROOT/.whl" ] && [[ " $* " != *" --wheelhouse "* ]] && ! "$PYTHON" -c 'import fairseq' 2>/dev/null; then
  ARGS=(--wheelhouse "$ROOT/.whl" "${ARGS[@]}")
fi
cd "$ROOT"
exec env PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m benchmarks speed-table "${ARGS[@]}"
