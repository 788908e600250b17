#!/usr/bin/env bash
# Collect everything umst_plugin needs on an offline node, except torch, into one folder.
#
# Run this where PyPI is reachable; carry the folder to the node; run scripts/offline-install.sh there.
# The folder holds: fairseq-fixed's SOURCE archive (it compiles C++/Cython extensions against
# the node's own torch, so it is built there), binary wheels for the target Python/platform of
# everything else fairseq and the plugin import, a pure-Python wheel of antlr4-python3-runtime
# (PyPI has only an sdist), a wheel of this plugin, requirements.txt and MANIFEST.txt.
# Never torch (nor torchaudio/torchvision/triton/nvidia-*): the node's own torch is used.
#
# Usage: scripts/offline-wheelhouse.sh [--dest DIR] [--python-version X.Y] [--platform TAG]...
#            [--skip-present "a,b,..." | --full] [--builder-python PY] [--dry-run]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# ---------------------------------------------------------------------------------------------
# The pinned closure: name==version, how it is fetched, who needs it. Versions are the ones the
# repo's .venv (scripts/setup_env.sh) resolved and the test suite ran with; they have cp311 and
# cp312 manylinux wheels. tests/test_offline_install.py checks them against setup.py.
# (fairseq-fixed's own metadata says hydra-core==1.3.2, omegaconf==2.3.0; it is installed with
# --no-deps everywhere and runs with these, as setup.py's ranges allow.)
#   kind: sdist = fairseq source archive; build = pure-Python wheel built here from the sdist;
#         wheel = binary/universal wheel for the target Python; plugin = this repo
PINS="
fairseq-fixed==0.12.3.1        sdist   umst-plugin (built on the node against its torch)
hydra-core==1.3.8              wheel   fairseq-fixed, umst-plugin
omegaconf==2.3.1               wheel   fairseq-fixed, umst-plugin, hydra-core
antlr4-python3-runtime==4.9.3  build   hydra-core, omegaconf (==4.9.*)
PyYAML==6.0.3                  wheel   omegaconf
bitarray==3.12.3               wheel   fairseq-fixed
conllu==6.0.0                  wheel   umst-plugin (umst-preprocess --parser conllu)
tensorboardX==2.6.5            wheel   umst-plugin (fairseq --tensorboard-logdir)
subword-nmt==0.3.8             wheel   umst-plugin (the toy corpus's BPE: quickstart, GPU check)
mock==5.2.0                    wheel   subword-nmt
protobuf==7.36.2               wheel   tensorboardX
cffi==2.1.1                    wheel   fairseq-fixed, umst-plugin
pycparser==3.12                wheel   cffi
regex==2026.11.15              wheel   fairseq-fixed, sacrebleu
sacrebleu==2.6.0               wheel   fairseq-fixed, umst-plugin
portalocker==4.4.2             wheel   sacrebleu
tabulate==0.10.0               wheel   sacrebleu
colorama==0.4.6                wheel   sacrebleu
lxml==6.1.3                    wheel   sacrebleu
numpy==2.4.6                   wheel   fairseq-fixed, umst-plugin (and fairseq's build)
tqdm==4.70.1                   wheel   fairseq-fixed, umst-plugin
packaging==26.3                wheel   fairseq-fixed, hydra-core, umst-plugin
scikit-learn==1.9.1            wheel   fairseq-fixed (imported by fairseq.criterions)
scipy==1.17.1                  wheel   scikit-learn
joblib==1.6.0                  wheel   scikit-learn
threadpoolctl==3.8.0           wheel   scikit-learn
narwhals==2.29.0               wheel   scikit-learn
cloudpickle==3.1.2             wheel   joblib
Cython==3.3.1                  wheel   fairseq-fixed (build and runtime)
setuptools==84.2.1             wheel   fairseq-fixed's build (--no-build-isolation)
wheel==0.48.0                  wheel   fairseq-fixed's build (--no-build-isolation)
pytest==9.2.0                  wheel   the GPU check's CUDA tests (scripts/gpu-check.sh)
pytest-xdist==3.8.0            wheel   pytest -n
execnet==2.1.2                 wheel   pytest-xdist
iniconfig==2.3.1               wheel   pytest
pluggy==1.7.0                  wheel   pytest
Pygments==2.21.0               wheel   pytest
umst-plugin==0.1.0             plugin  this repository (pip wheel --no-deps .)
"
# What the GPU image ('cuda': Python 3.12.3, torch 2.11.0+cu130) already has, among the names
# above (/work/.library/device/KINDS.md, "Python packages already there"). Skipped by default;
# offline-install.sh checks they really are importable before it installs anything.
GPU_IMAGE_PRESENT="numpy,regex,sacrebleu,portalocker,tabulate,colorama,lxml,scikit-learn,scipy,joblib,threadpoolctl,narwhals,cloudpickle,packaging,tqdm,PyYAML,protobuf,Cython,setuptools,wheel,pytest,pytest-xdist,execnet,iniconfig,pluggy,Pygments"

DEST="$ROOT/.whl"
PYVER="3.12"
PLATFORMS=()
SKIP="$GPU_IMAGE_PRESENT"
MODE="skip-present"
DRY=0
BUILDER="${BUILDER_PYTHON:-}"
HOST_PY="${PYTHON:-python3}"

usage() {
  cat <<EOF
Usage: scripts/offline-wheelhouse.sh [options]
Collect fairseq-fixed (sdist) + wheels of everything else umst_plugin needs, except torch, for an
offline node. Then carry DIR to the node and run scripts/offline-install.sh DIR there.

  --dest DIR            output folder (default: <repo>/.whl); refreshed if it is an earlier wheelhouse
  --python-version X.Y  the node's Python (default 3.12, the GPU image's)
  --platform TAG        a wheel platform tag, repeatable
                        (default: manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)
  --skip-present LIST   comma-separated names the node already has: left out
                        (default: the GPU image's: $GPU_IMAGE_PRESENT)
  --full                leave nothing out (a bare Python that has only torch)
  --builder-python PY   a Python WITH torch used to fetch fairseq-fixed's sdist (pip runs its
                        setup.py, which imports torch; default: <repo>/.venv/bin/python, else python3)
  --dry-run             print the package list and the exact pip commands; download nothing
  -h, --help            this text
EOF
}

while [ $# -gt 0 ]; do
  case "$1" in
    --dest) DEST="$2"; shift 2 ;;
    --python-version) PYVER="$2"; shift 2 ;;
    --platform) PLATFORMS+=("$2"); shift 2 ;;
    --skip-present) SKIP="$2"; MODE="skip-present"; shift 2 ;;
    --full) SKIP=""; MODE="full"; shift ;;
    --builder-python) BUILDER="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "offline-wheelhouse: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
case "$PYVER" in 3.[0-9]|3.[0-9][0-9]) ;; *) echo "offline-wheelhouse: --python-version wants X.Y, got '$PYVER'" >&2; exit 2 ;; esac
[ ${#PLATFORMS[@]} -eq 0 ] && PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)
if [ -z "$BUILDER" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then BUILDER="$ROOT/.venv/bin/python"; else BUILDER="$HOST_PY"; fi
fi
CPTAG="cp${PYVER/./}"

norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }   # PEP 503 name normalisation
skipped() {  # is $1 in the skip list?
  local n; n="$(norm "$1")"
  local IFS=','
  for s in $SKIP; do s="$(echo "$s" | tr -d ' ')"; [ -n "$s" ] && [ "$(norm "$s")" = "$n" ] && return 0; done
  return 1
}

# ---- the selection
WHEELS=(); BUILDS=(); SDISTS=(); LEFT_OUT=(); ORDER=()
while read -r spec kind _; do
  [ -z "$spec" ] && continue
  name="${spec%%==*}"
  case "$(norm "$name")" in torch|torchaudio|torchvision|triton|nvidia-*)
    echo "offline-wheelhouse: refusing to collect $name: the node's own torch is used" >&2; exit 1 ;; esac
  if [ "$kind" != sdist ] && [ "$kind" != plugin ] && skipped "$name"; then
    LEFT_OUT+=("$spec"); continue
  fi
  ORDER+=("$spec")
  case "$kind" in
    wheel) WHEELS+=("$spec") ;;
    build) BUILDS+=("$spec") ;;
    sdist) SDISTS+=("$spec") ;;
    plugin) ;;
  esac
done <<< "$PINS"

PLATFORM_ARGS=(); for p in "${PLATFORMS[@]}"; do PLATFORM_ARGS+=(--platform "$p"); done
CMD_WHEELS=("$HOST_PY" -m pip download --no-deps --only-binary=:all: --python-version "$PYVER"
            --implementation cp "${PLATFORM_ARGS[@]}" -d "$DEST" "${WHEELS[@]}")
CMD_BUILDS=("$HOST_PY" -m pip wheel --no-deps -w "$DEST" "${BUILDS[@]}")
CMD_SDIST=("$BUILDER" -m pip download --no-deps --no-binary=fairseq-fixed --no-build-isolation -d "$DEST" "${SDISTS[@]}")
CMD_PLUGIN=("$HOST_PY" -m pip wheel --no-deps -w "$DEST" "$ROOT")

echo "[wheelhouse] target: CPython $PYVER ($CPTAG), platforms: ${PLATFORMS[*]}; mode: $MODE; dest: $DEST"
echo "[wheelhouse] collect (${#ORDER[@]}):"
for s in "${ORDER[@]}"; do echo "  + $s"; done
if [ ${#LEFT_OUT[@]} -gt 0 ]; then
  echo "[wheelhouse] left out, expected on the node (--skip-present; --full includes them):"
  for s in "${LEFT_OUT[@]}"; do echo "  - ${s%%==*} (tested with ${s#*==})"; done
fi
echo "[wheelhouse] never: torch, torchaudio, torchvision, triton, nvidia-* (the node's own torch is used)"
echo "[wheelhouse] commands:"
for c in CMD_WHEELS CMD_BUILDS CMD_SDIST CMD_PLUGIN; do
  declare -n arr="$c"
  [ "$c" = CMD_BUILDS ] && [ ${#BUILDS[@]} -eq 0 ] && continue
  printf '  '; printf '%q ' "${arr[@]}"; echo
done
if [ "$DRY" = 1 ]; then echo "[wheelhouse] dry run: nothing downloaded"; exit 0; fi

# ---- the real thing
if ! "$BUILDER" -c "import torch" 2>/dev/null; then
  echo "offline-wheelhouse: $BUILDER cannot import torch; pip runs fairseq-fixed's setup.py (which imports" >&2
  echo "  torch) even just to download its sdist. Pass --builder-python with one that has torch" >&2
  echo "  (bash scripts/setup_env.sh makes <repo>/.venv)." >&2
  exit 1
fi
if [ -d "$DEST" ] && [ -n "$(ls -A "$DEST")" ]; then
  if [ -f "$DEST/MANIFEST.txt" ]; then
    echo "[wheelhouse] refreshing the earlier wheelhouse in $DEST"
    rm -f "$DEST"/*.whl "$DEST"/*.tar.gz "$DEST"/*.zip "$DEST/MANIFEST.txt" "$DEST/requirements.txt"
  else
    echo "offline-wheelhouse: $DEST is not empty and is no wheelhouse (no MANIFEST.txt); pick another --dest" >&2
    exit 1
  fi
fi
mkdir -p "$DEST"
echo "[wheelhouse] 1/4 binary wheels for $CPTAG"
"${CMD_WHEELS[@]}"
if [ ${#BUILDS[@]} -gt 0 ]; then
  echo "[wheelhouse] 2/4 pure-Python wheels built from sdists: ${BUILDS[*]}"
  "${CMD_BUILDS[@]}"
fi
echo "[wheelhouse] 3/4 fairseq-fixed source archive"
"${CMD_SDIST[@]}"
echo "[wheelhouse] 4/4 the plugin's wheel"
"${CMD_PLUGIN[@]}"
cp "$ROOT/scripts/offline-install.sh" "$DEST/"   # the folder installs itself: bash DIR/offline-install.sh

# requirements.txt (install order) + MANIFEST.txt; check every file's tags, no torch, the size.
"$HOST_PY" - "$DEST" "$PYVER" "$MODE" "${PLATFORMS[*]}" "$(IFS=,; echo "${ORDER[*]}")" \
  "$(IFS=,; echo "${LEFT_OUT[*]}")" <<'EOF'
import hashlib, os, re, sys, time
dest, pyver, mode, platforms, order, left = sys.argv[1:7]
order = [s for s in order.split(",") if s]
left = [s for s in left.split(",") if s]
cp = "cp" + pyver.replace(".", "")
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
files = sorted(f for f in os.listdir(dest) if f.endswith((".whl", ".tar.gz", ".zip")))
by_name, problems = {}, []
for f in files:
    if f.endswith(".whl"):
        name, ver, *_rest = f[:-4].split("-")
        py, abi, plat = f[:-4].split("-")[-3:]
        ok = (py in (cp,) and abi in (cp, "abi3")) or (abi == "abi3" and py.startswith("cp")) or \
             (abi == "none" and plat == "any" and any(t in ("py3", "py2") for t in py.split(".")))
        if abi == "abi3" and int(py[3:] or 0) > int(cp[3:]):
            ok = False
        if not ok:
            problems.append(f"{f}: not a {cp}/abi3/py3-none-any wheel")
    else:
        name, ver = f.rsplit(".tar.gz", 1)[0].rsplit("-", 1)
        if norm(name) != "fairseq-fixed":
            problems.append(f"{f}: the only source archive expected is fairseq-fixed's")
    if norm(name) in ("torch", "torchaudio", "torchvision", "triton") or norm(name).startswith("nvidia-"):
        problems.append(f"{f}: torch-family files must never be in the wheelhouse")
    by_name[norm(name)] = (f, ver)
for spec in order:
    n, v = spec.split("==")
    got = by_name.get(norm(n))
    if got is None:
        problems.append(f"{spec}: no file collected")
    elif got[1] != v:
        problems.append(f"{spec}: collected {got[0]}")
extra = set(by_name) - {norm(s.split("==")[0]) for s in order}
problems += [f"{by_name[e][0]}: not in the pinned list" for e in sorted(extra)]
with open(os.path.join(dest, "requirements.txt"), "w") as out:
    out.write("# umst_plugin offline wheelhouse, install order (scripts/offline-install.sh)\n")
    out.write("".join(s + "\n" for s in order))
total = 0
with open(os.path.join(dest, "MANIFEST.txt"), "w") as out:
    out.write("# umst_plugin offline wheelhouse (scripts/offline-wheelhouse.sh)\n")
    out.write(f"created: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n")
    out.write(f"python-version: {pyver}\nabi: {cp}\nplatforms: {platforms}\nmode: {mode}\n")
    out.write("never-included: torch torchaudio torchvision triton nvidia-*\n")
    out.write("expected-present: " + " ".join(left) + "\n")
    out.write("files:\n")
    for f in files:
        p = os.path.join(dest, f)
        size = os.path.getsize(p)
        total += size
        sha = hashlib.sha256(open(p, "rb").read()).hexdigest()
        out.write(f"  {f}  {size}  sha256:{sha}\n")
    out.write(f"total-bytes: {total}\n")
print(f"[wheelhouse] {len(files)} files, {total / 2**20:.1f} MiB:")
for f in files:
    print(f"  {os.path.getsize(os.path.join(dest, f)) / 2**20:7.2f} MiB  {f}")
if problems:
    print("offline-wheelhouse: PROBLEMS:\n  " + "\n  ".join(problems), file=sys.stderr)
    sys.exit(1)
EOF
echo "[wheelhouse] done: $(du -sh "$DEST" | cut -f1) in $DEST (requirements.txt, MANIFEST.txt)"
echo "[wheelhouse] on the node: bash DIR/offline-install.sh   (DIR = this folder, carried there)"
