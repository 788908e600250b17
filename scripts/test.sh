#!/usr/bin/env bash
# Set up the environment if needed, then run the test suite.
# Three workers on two cores: with two, a fifth of the cores' time stood idle (tests waiting on Slurm's timers in
# the WMT rehearsal, on trainings they kill and resume, on pip), which a third worker fills (Intel Xeon, 2 cores:
# 1,979 s of pytest with two workers, 1,770 s with three; docs/tests-and-benchmarks.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "${VENV:-$ROOT/.venv}/bin/python" -m pytest -n 3 --dist loadfile --no-loadscope-reorder -q "$@" tests
