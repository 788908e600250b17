#!/usr/bin/env bash
# Set up the environment if needed, then run the test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "${VENV:-$ROOT/.venv}/bin/python" -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q "$@" tests
