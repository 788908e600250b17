#!/usr/bin/env bash
# Set up the environment if needed, then run the test suite.
# Four workers on two cores: tests wait on Slurm's timers in the WMT rehearsal, on trainings they kill and resume,
# on pip, and the cores stand idle unless other workers fill that time (Intel Xeon, 2 cores: 1,979 s of pytest with
# two workers, 1,770 s with three; AMD EPYC Zen 4, 2 cores: 1,443 s with three, 1,346 s with four, 1.59 and 1.62
# cores busy; docs/tests-and-benchmarks.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "${VENV:-$ROOT/.venv}/bin/python" -m pytest -n 4 --dist loadfile --no-loadscope-reorder -q "$@" tests
