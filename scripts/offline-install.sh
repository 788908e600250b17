#!/usr/bin/env bash
# Install umst_plugin + fairseq-fixed on an offline node from a wheelhouse made by
# scripts/offline-wheelhouse.sh, on top of the torch already there. Never installs torch.
#
# Usage: offline-install.sh [DIR] [--target TDIR] [--python PY] [--cuda-ext] [--no-smoke]
#   DIR       the wheelhouse (default: this script's folder if it holds MANIFEST.txt, else <repo>/.whl)
# Steps: 0 checks (torch imports, no torch-family file in DIR, Python version matches, the
# packages the wheelhouse left out are present) -> 1 wheels (--no-index --no-deps) -> 2 build
# fairseq-fixed from its sdist against this torch (--no-build-isolation --no-deps) -> 3 the plugin
# -> 4 dependency check -> 5 smoke check (imports, the archs register, fairseq-train --help --user-dir).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
  cat <<'EOF'
Usage: offline-install.sh [DIR] [--target TDIR] [--python PY] [--cuda-ext] [--no-smoke]
Install umst_plugin and fairseq-fixed from the wheelhouse DIR (made by offline-wheelhouse.sh)
with pip --no-index, on top of the torch already in PY. Never installs torch: it refuses if
`import torch` fails or if DIR holds a torch-family file.

  DIR            the wheelhouse (default: this script's folder if it holds MANIFEST.txt,
                 else <repo>/.whl)
  --python PY    the Python to install into (default: $PYTHON, else python3)
  --target TDIR  install into TDIR with pip --target (for a read-only system Python); then use
                 it with PYTHONPATH=TDIR and PATH=TDIR/bin (printed at the end)
  --cuda-ext     keep CUDA_HOME while building fairseq, so it also compiles its optional CUDA
                 kernels (libnat_cuda, ngram_repeat_block_cuda; needs nvcc matching torch).
                 Default: CUDA_HOME unset for the build: C++/Cython extensions only, which is
                 all fairseq-train/generate need (they fall back to PyTorch code)
  --no-smoke     skip step 5
  -h, --help     this text
Environment: MAX_JOBS (parallel compile jobs for fairseq's build, default: all cores).
EOF
}

DIR=""; TARGET=""; PY="${PYTHON:-python3}"; CUDA_EXT=0; SMOKE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --target) TARGET="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --cuda-ext) CUDA_EXT=1; shift ;;
    --no-smoke) SMOKE=0; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "offline-install: unknown option: $1" >&2; usage >&2; exit 2 ;;
    *) [ -n "$DIR" ] && { echo "offline-install: one DIR only" >&2; exit 2; }; DIR="$1"; shift ;;
  esac
done
if [ -z "$DIR" ]; then
  if [ -f "$HERE/MANIFEST.txt" ]; then DIR="$HERE"; else DIR="$(cd "$HERE/.." && pwd)/.whl"; fi
fi
die() { echo "offline-install: ERROR: $*" >&2; exit 1; }
step() { echo; echo "[offline-install] $*"; }

# ---- 0. checks, before anything is installed
step "0/5 checks"
[ -d "$DIR" ] || die "no wheelhouse folder $DIR (make one with scripts/offline-wheelhouse.sh)"
DIR="$(cd "$DIR" && pwd)"
[ -f "$DIR/MANIFEST.txt" ] && [ -f "$DIR/requirements.txt" ] || die "$DIR has no MANIFEST.txt/requirements.txt: not a wheelhouse from offline-wheelhouse.sh"
echo "  wheelhouse: $DIR ($(du -sh "$DIR" | cut -f1))"
command -v "$PY" >/dev/null 2>&1 || die "no Python '$PY' (pass --python)"
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac
echo "  python: $(command -v "$PY") ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
# torch-family files: a pip run could pick them; there must be none.
BAD="$(cd "$DIR" && ls -1 | grep -iE '^(torch|torchaudio|torchvision|triton|nvidia[-_])[^/]*\.(whl|tar\.gz|zip)$' || true)"
[ -z "$BAD" ] || die "the wheelhouse holds torch-family files; refusing (this script never installs a second torch):
$BAD"
if [ -n "$TARGET" ]; then
  mkdir -p "$TARGET"; TARGET="$(cd "$TARGET" && pwd)"
  export PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$TARGET/bin:$PATH"
  echo "  installing into --target $TARGET (PYTHONPATH and PATH extended for every step)"
fi
TORCH_BEFORE="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)" || die "'$PY' cannot import torch.
  This wheelhouse deliberately has no torch: install the node's torch first (or pass --python
  with the Python that has it). Refusing, so that pip never pulls a second torch."
echo "  torch: $TORCH_BEFORE (kept; constrained to exactly this version in every pip call)"
WANT_PY="$(sed -n 's/^python-version: //p' "$DIR/MANIFEST.txt")"
HAVE_PY="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$WANT_PY" = "$HAVE_PY" ] || die "the wheelhouse is for Python $WANT_PY, '$PY' is $HAVE_PY; rebuild it with offline-wheelhouse.sh --python-version $HAVE_PY"
# What the wheelhouse left out (--skip-present) must already be here.
EXPECTED="$(sed -n 's/^expected-present: //p' "$DIR/MANIFEST.txt")"
if [ -n "$EXPECTED" ]; then
  MISSING="$("$PY" - $EXPECTED <<'EOF'
import sys
from importlib import metadata
missing = []
for spec in sys.argv[1:]:
    name = spec.split("==")[0]
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        missing.append(name)
print(" ".join(missing))
EOF
)"
  [ -z "$MISSING" ] || die "the wheelhouse left out packages this Python does not have: $MISSING
  Rebuild it with offline-wheelhouse.sh --full (or --skip-present without them)."
  echo "  present as the wheelhouse expects: $(echo "$EXPECTED" | wc -w) packages"
fi
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
cd "$WORK"   # so that no umst_plugin/ or fairseq/ in the caller's folder shadows what gets installed
echo "torch==$TORCH_BEFORE" > "$WORK/constraints.txt"
# --isolated: no PIP_* variables or user pip.conf (e.g. extra find-links) take part.
PIP=("$PY" -m pip --isolated install --no-index --find-links "$DIR" --no-deps -c "$WORK/constraints.txt")
[ -n "$TARGET" ] && PIP_TGT=(--target "$TARGET") || PIP_TGT=()
REQS=(); FAIRSEQ=""; PLUGIN=""
while read -r line; do
  case "$line" in ''|\#*) continue ;; fairseq-fixed==*) FAIRSEQ="$line" ;; umst-plugin==*) PLUGIN="$line" ;; *) REQS+=("$line") ;; esac
done < "$DIR/requirements.txt"
[ -n "$FAIRSEQ" ] && [ -n "$PLUGIN" ] || die "requirements.txt names no fairseq-fixed or umst-plugin"

# ---- 1. binary wheels
step "1/5 wheels: ${REQS[*]:-(none)}"
if [ ${#REQS[@]} -gt 0 ]; then
  ( set -x; "${PIP[@]}" "${PIP_TGT[@]}" "${REQS[@]}" )
fi

# ---- 2. fairseq-fixed, compiled here against this torch
step "2/5 building $FAIRSEQ from its sdist against torch $TORCH_BEFORE (a few minutes; --no-build-isolation --no-deps)"
BUILD_ENV=(env)
[ "$CUDA_EXT" = 1 ] || BUILD_ENV=(env -u CUDA_HOME -u CUDA_PATH)
[ -n "${MAX_JOBS:-}" ] || BUILD_ENV+=("MAX_JOBS=$(nproc 2>/dev/null || echo 4)")
t0=$(date +%s)
( set -x; "${BUILD_ENV[@]}" "$PY" -m pip --isolated wheel --no-index --find-links "$DIR" --no-deps \
    --no-build-isolation -c "$WORK/constraints.txt" -w "$WORK/built" "$FAIRSEQ" )
echo "  built in $(( $(date +%s) - t0 )) s: $(ls "$WORK/built")"

# ---- 3. install fairseq + the plugin
step "3/5 installing $FAIRSEQ and $PLUGIN"
if [ -n "$TARGET" ]; then
  # pip --target replaces whole top-level folders (bin/ included) that a later call brings again,
  # so the final state is one call with everything (--upgrade; local files, a few seconds).
  ( set -x; "${PIP[@]}" --target "$TARGET" --upgrade --find-links "$WORK/built" "${REQS[@]}" "$FAIRSEQ" "$PLUGIN" )
else
  ( set -x; "${PIP[@]}" --find-links "$WORK/built" "$FAIRSEQ" "$PLUGIN" )
fi

# ---- 4. dependency check (pip ran with --no-deps; make sure nothing is missing)
step "4/5 dependency check"
"$PY" - "$TORCH_BEFORE" <<'EOF'
import sys
from importlib import metadata
from packaging.requirements import Requirement
torch_before = sys.argv[1]
import torch
assert torch.__version__ == torch_before, f"torch changed: {torch_before} -> {torch.__version__}"
bad = []
for dist, strict, ignore in (("umst-plugin", True, ()), ("fairseq-fixed", False, ("torchaudio",))):
    for r in metadata.requires(dist) or []:
        req = Requirement(r)
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name in ignore:
            print(f"  {dist}: {r}: not needed by fairseq-train/generate here, not checked")
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is not None and req.specifier.contains(have, prereleases=True):
            continue
        msg = f"  {dist}: {r}: " + (f"have {have}" if have else "MISSING")
        if strict or have is None:
            bad.append(msg)
        else:
            print(msg + " (fairseq-fixed's exact pin; umst-plugin's range is what is tested)")
print(f"  torch {torch.__version__} unchanged")
if bad:
    print("offline-install: ERROR: unmet requirements:\n" + "\n".join(bad), file=sys.stderr)
    sys.exit(1)
print("  umst-plugin's requirements are all met")
EOF

# ---- 5. smoke check
USER_DIR="$("$PY" -c 'import os, umst_plugin; print(os.path.dirname(umst_plugin.__file__))')"
if [ "$SMOKE" = 1 ]; then
  step "5/5 smoke check"
  ( set -x; "$PY" -c "
import fairseq, torch, umst_plugin
from fairseq.tasks import TASK_REGISTRY
from umst_plugin import families
archs = list(families.archs())
assert 'umst_base' in archs and 'multiscale_translation' in TASK_REGISTRY, archs
print('fairseq', fairseq.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())
print(len(archs), 'plugin archs:', ' '.join(archs))
" )
  # the console script pip just wrote: --target's bin/, else this Python's scripts folder
  # (a venv's bin/, which need not be on PATH when --python names its interpreter)
  SCRIPTS="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
  FT=""
  for cand in ${TARGET:+"$TARGET/bin/fairseq-train"} "$SCRIPTS/fairseq-train" "$(command -v fairseq-train || true)"; do
    [ -n "$cand" ] && [ -x "$cand" ] && { FT="$cand"; break; }
  done
  [ -n "$FT" ] || die "no fairseq-train in ${TARGET:+$TARGET/bin, }$SCRIPTS or on PATH"
  ( set -x; "$FT" --help --user-dir "$USER_DIR" --task multiscale_translation > "$WORK/help.txt" )
  grep -q -- "--arch" "$WORK/help.txt" || die "fairseq-train --help printed no --arch"
  echo "  fairseq-train --help --user-dir $USER_DIR: ok ($(wc -l < "$WORK/help.txt") lines, $FT)"
else
  step "5/5 smoke check skipped (--no-smoke)"
fi
echo
echo "[offline-install] done. Use the plugin with: fairseq-train DATA --user-dir $USER_DIR --task multiscale_translation --arch ..."
if [ -n "$TARGET" ]; then
  echo "[offline-install] with --target, first: export PYTHONPATH=$TARGET\${PYTHONPATH:+:\$PYTHONPATH} PATH=$TARGET/bin:\$PATH"
fi
