#!/usr/bin/env bash
# Train one table row: fairseq-hydra-train with configs/ROW.yaml and the plugin as common.user_dir
# (plain fairseq-hydra-train works too; this script adds the GPU-count scaling below).
#
#   bash scripts/train.sh ROW --data DATA_BIN [--save-dir DIR] [--gpus N] [-- HYDRA_OVERRIDES...]
#   bash scripts/train.sh umst-t2-umst-base --data data/wmt14_en_de/data-bin/wmt14_en_de_bpe32000
#
# Each config notes the GPU count its batch assumes (8 for UMST/TranSFormer/MSC
# rows, 4 for Prime rows). On N GPUs this script multiplies update_freq by
# ASSUMED/N so the tokens per update stay the paper's. Without a GPU it trains
# on the CPU in fp32 (only sensible for smoke tests). Anything after "--" is
# passed to hydra, e.g. "-- optimization.max_update=10 dataset.max_tokens=500".
# Checkpoints and the hydra log go to --save-dir (default checkpoints/ROW).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"

usage() { sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
[[ $# -ge 1 && "$1" != -h && "$1" != --help ]] || { usage; exit 0; }
ROW="$1"; shift
DATA=""; SAVE="checkpoints/$ROW"; GPUS=""; OVERRIDES=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --data) DATA="$2"; shift 2 ;;
        --save-dir) SAVE="$2"; shift 2 ;;
        --gpus) GPUS="$2"; shift 2 ;;
        --) shift; OVERRIDES=("$@"); break ;;
        *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done
CONFIG="$ROOT/configs/$ROW.yaml"
[[ -f "$CONFIG" ]] || { echo "no config $CONFIG; rows: $(cd "$ROOT/configs" && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' ')" >&2; exit 2; }
[[ -n "$DATA" ]] || { echo "--data DATA_BIN is required (see scripts/prepare-*.sh)" >&2; exit 2; }
[[ -d "$DATA" ]] || { echo "no data-bin directory $DATA" >&2; exit 2; }
DATA="$(cd "$DATA" && pwd)"
mkdir -p "$SAVE"; SAVE="$(cd "$SAVE" && pwd)"

if [[ -z "$GPUS" ]]; then
    GPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
fi
read -r ASSUMED UF < <("$PY" - "$CONFIG" <<'EOF'
import sys
from omegaconf import OmegaConf
cfg = OmegaConf.load(sys.argv[1])
print(cfg.distributed_training.distributed_world_size, cfg.optimization.update_freq[0])
EOF
)
ARGS=()
if [[ "$GPUS" -eq 0 ]]; then
    echo "[train.sh] $ROW assumes $ASSUMED GPUs; no GPU found: CPU, fp32, update_freq $UF (smoke tests only)" >&2
    ARGS+=(common.cpu=true common.fp16=false distributed_training.distributed_world_size=1)
else
    NEW_UF=$(( UF * ASSUMED / GPUS )); [[ "$NEW_UF" -ge 1 ]] || NEW_UF=1
    if (( UF * ASSUMED != NEW_UF * GPUS )); then
        echo "[train.sh] WARNING: $ASSUMED x $UF is not divisible by $GPUS GPUs; the batch differs from the paper's" >&2
    fi
    echo "[train.sh] $ROW assumes $ASSUMED GPUs x update_freq $UF; running on $GPUS GPUs x update_freq $NEW_UF" >&2
    ARGS+=(distributed_training.distributed_world_size="$GPUS" "optimization.update_freq=[$NEW_UF]")
fi

set -x
exec "$PY" -m fairseq_cli.hydra_train \
    --config-dir "$ROOT/configs" --config-name "$ROW" \
    task.data="$DATA" common.user_dir="$ROOT/umst_plugin" checkpoint.save_dir="$SAVE" hydra.run.dir="$SAVE" \
    "${ARGS[@]}" "${OVERRIDES[@]}"
