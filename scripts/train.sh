#!/usr/bin/env bash
# Train one table row: fairseq-hydra-train with configs/ROW.yaml and the plugin as common.user_dir
# (plain fairseq-hydra-train works too; this script adds the GPU-count scaling below).
#
#   bash scripts/train.sh ROW --data DATA_BIN [--save-dir DIR] [--gpus G] [--amp-bf16] [--compile] [--tf32] [--dry-run]
#        [--nnodes N --node-rank R --master-addr HOST [--master-port PORT]] [-- HYDRA_OVERRIDES...]
#   bash scripts/train.sh umst-t2-umst-base --data data/wmt14_en_de/data-bin/wmt14_en_de_bpe32000
#
# Each config notes the GPU count its batch assumes (8 for UMST/TranSFormer/MSC
# rows, 4 for Prime rows). On N machines x G GPUs this script multiplies update_freq
# by ASSUMED/(N*G) so the tokens per update stay the paper's. Without a GPU it trains
# on the CPU in fp32 (only sensible for smoke tests), one process per machine, the
# config's update_freq split over the machines (gloo). Several machines: run the same
# command on each with --node-rank 0..N-1 (fairseq's own tcp:// rendezvous at HOST:PORT,
# default port 29500); each machine uses exactly --gpus devices (CUDA_VISIBLE_DEVICES: its first G), so the
# ranks of machine R are R*G .. R*G+G-1 and never overlap another machine's. --amp-bf16: bf16 autocast on fp32
# master weights (--amp --amp-dtype bfloat16) instead of the configs' fp16 (fairseq's own --bf16, pure bf16
# weights, is another thing: train.sh does not offer it). --compile: torch.compile every encoder and decoder layer
# (docs/compile.md); --tf32: fp32 matmuls on TF32 tensor cores. --dry-run: print the command and its environment.
# Anything after "--" is passed to hydra, e.g. "-- optimization.max_update=10
# dataset.max_tokens=500"; an optimization.update_freq or distributed_world_size there
# replaces the config's before the scaling. Checkpoints and the hydra log go to
# --save-dir (default checkpoints/ROW).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/lib/env.sh"  # find_python: $PYTHON, the active venv, else .venv (no activation needed)

usage() { sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
[[ $# -ge 1 && "$1" != -h && "$1" != --help ]] || { usage; exit 0; }
ROW="$1"; shift
DATA=""; SAVE="checkpoints/$ROW"; GPUS=""; OVERRIDES=(); BF16=0; DRY=0; COMPILE=0; TF32=0
NNODES=1; NODE_RANK=0; MASTER_ADDR=""; MASTER_PORT=29500
while [[ $# -gt 0 ]]; do
    case "$1" in
        --data) DATA="$2"; shift 2 ;;
        --save-dir) SAVE="$2"; shift 2 ;;
        --gpus) GPUS="$2"; shift 2 ;;
        --amp-bf16) BF16=1; shift ;;
        --bf16) echo "train.sh: --bf16 is now --amp-bf16 (bf16 autocast, fp32 master weights, --amp --amp-dtype bfloat16);" \
                     "fairseq's --bf16 means pure bf16 weights, which train.sh does not offer" >&2; exit 2 ;;
        --dry-run) DRY=1; shift ;;
        --compile) COMPILE=1; shift ;;
        --tf32) TF32=1; shift ;;
        --nnodes) NNODES="$2"; shift 2 ;;
        --node-rank) NODE_RANK="$2"; shift 2 ;;
        --master-addr) MASTER_ADDR="$2"; shift 2 ;;
        --master-port) MASTER_PORT="$2"; shift 2 ;;
        --) shift; OVERRIDES=("$@"); break ;;
        *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done
find_python
CONFIG="$ROOT/configs/$ROW.yaml"
[[ -f "$CONFIG" ]] || { echo "no config $CONFIG; rows: $(cd "$ROOT/configs" && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' ')" >&2; exit 2; }
[[ -n "$DATA" ]] || { echo "--data DATA_BIN is required (see scripts/prepare-*.sh)" >&2; exit 2; }
if [[ "$DRY" -eq 0 ]]; then
    [[ -d "$DATA" ]] || { echo "no data-bin directory $DATA" >&2; exit 2; }
    DATA="$(cd "$DATA" && pwd)"
    mkdir -p "$SAVE"; SAVE="$(cd "$SAVE" && pwd)"
fi

if [[ -z "$GPUS" ]]; then
    GPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
fi
if [[ "$NNODES" -gt 1 ]]; then
    [[ -n "$MASTER_ADDR" ]] || { echo "--nnodes $NNODES needs --master-addr (the host of --node-rank 0)" >&2; exit 2; }
    (( NODE_RANK >= 0 && NODE_RANK < NNODES )) || { echo "--node-rank must be in 0..$((NNODES - 1))" >&2; exit 2; }
fi
# The batch the row asks for: the config's GPU count and update_freq, unless the overrides replace them
# (those two overrides are consumed here and passed on scaled).
read -r ASSUMED UF < <("$PY" - "$CONFIG" ${OVERRIDES[@]+"${OVERRIDES[@]}"} <<'EOF'
import sys
from omegaconf import OmegaConf
cfg = OmegaConf.load(sys.argv[1])
keys = ("optimization.update_freq", "distributed_training.distributed_world_size")
dots = [o.lstrip("+") for o in sys.argv[2:] if o.lstrip("+").split("=", 1)[0] in keys]
cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dots))
print(cfg.distributed_training.distributed_world_size, cfg.optimization.update_freq[0])
EOF
)
KEPT=()
for o in ${OVERRIDES[@]+"${OVERRIDES[@]}"}; do
    case "${o#+}" in optimization.update_freq=*|distributed_training.distributed_world_size=*) ;; *) KEPT+=("$o") ;; esac
done
OVERRIDES=(${KEPT[@]+"${KEPT[@]}"})
ARGS=()
if [[ "$GPUS" -eq 0 ]]; then
    # CPU: one process per machine; the config's update_freq is the batch of all of them together.
    WORLD="$NNODES"; NEW_UF=$(( UF / WORLD )); [[ "$NEW_UF" -ge 1 ]] || NEW_UF=1
    if (( NEW_UF * WORLD != UF )); then
        echo "[train.sh] WARNING: update_freq $UF is not divisible by $WORLD machines; the batch differs" >&2
    fi
    echo "[train.sh] $ROW assumes $ASSUMED GPUs; no GPU found: CPU, fp32, $WORLD process(es) x update_freq $NEW_UF (smoke tests only)" >&2
    ARGS+=(common.cpu=true common.fp16=false distributed_training.distributed_world_size="$WORLD" "optimization.update_freq=[$NEW_UF]")
    # glibc unmaps every freed allocation over 32 MB (the logits and their gradient: ~70 MB at Multi30k size),
    # so each step faults them in again; mmap off keeps them for reuse (same numbers, fewer page faults;
    # docs/multi30k.md, "CPU trainings reuse freed memory"). An explicit MALLOC_MMAP_MAX_ in the environment wins.
    export MALLOC_MMAP_MAX_="${MALLOC_MMAP_MAX_-0}" MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_-1099511627776}"
    if [[ "$WORLD" -gt 1 ]]; then
        # torch's DistributedDataParallel refuses device_ids for a CPU module and fairseq's pytorch_ddp always
        # passes them: legacy_ddp (fairseq's own all-reduce of the flattened gradients), over gloo.
        ARGS+=(distributed_training.distributed_rank="$NODE_RANK" distributed_training.distributed_no_spawn=true
               distributed_training.distributed_backend=gloo distributed_training.ddp_backend=legacy_ddp)
    fi
else
    WORLD=$(( NNODES * GPUS ))
    NEW_UF=$(( UF * ASSUMED / WORLD )); [[ "$NEW_UF" -ge 1 ]] || NEW_UF=1
    if (( UF * ASSUMED != NEW_UF * WORLD )); then
        echo "[train.sh] WARNING: $ASSUMED x $UF is not divisible by $WORLD GPUs; the batch differs from the paper's" >&2
    fi
    echo "[train.sh] $ROW assumes $ASSUMED GPUs x update_freq $UF; running on $NNODES machine(s) x $GPUS GPUs x update_freq $NEW_UF" >&2
    ARGS+=(distributed_training.distributed_world_size="$WORLD" "optimization.update_freq=[$NEW_UF]")
    # fairseq spawns min(visible devices, world size) processes here, ranks from distributed_rank up: show it
    # exactly GPUS devices (the first GPUS of those already visible), so this machine's ranks are
    # NODE_RANK*GPUS .. NODE_RANK*GPUS+GPUS-1 whatever else the machine has.
    VISIBLE="${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $(( GPUS - 1 )))}"
    export CUDA_VISIBLE_DEVICES="$(echo "$VISIBLE" | cut -d, -f1-"$GPUS")"
    [[ "$NNODES" -le 1 ]] || ARGS+=(distributed_training.distributed_rank=$(( NODE_RANK * GPUS )))
    echo "[train.sh] this machine: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES, ranks $(( NODE_RANK * GPUS ))..$(( NODE_RANK * GPUS + GPUS - 1 )) of $WORLD" >&2
fi
if [[ "$NNODES" -gt 1 ]]; then
    ARGS+=(distributed_training.distributed_init_method="tcp://$MASTER_ADDR:$MASTER_PORT")
    echo "[train.sh] machine $NODE_RANK of $NNODES, rendezvous tcp://$MASTER_ADDR:$MASTER_PORT, world size $WORLD" >&2
fi
if [[ "$BF16" -eq 1 ]]; then
    # bf16 autocast on fp32 master weights, loss scale 1 (umst_plugin/mixed_precision.py)
    [[ "$GPUS" -eq 0 ]] || ARGS+=(common.fp16=false)  # (the CPU branch above already turned fp16 off)
    ARGS+=(common.amp=true +common.amp_dtype=bfloat16)
fi

# common options the plugin adds: "+" because fairseq-hydra-train composes the config before it imports the plugin
[[ "$COMPILE" -eq 0 ]] || ARGS+=(+common.compile=true)
[[ "$TF32" -eq 0 ]] || ARGS+=(+common.tf32=true)

CMD=("$PY" -m fairseq_cli.hydra_train --config-dir "$ROOT/configs" --config-name "$ROW"
     task.data="$DATA" common.user_dir="$ROOT/umst_plugin" checkpoint.save_dir="$SAVE" hydra.run.dir="$SAVE"
     "${ARGS[@]}" ${OVERRIDES[@]+"${OVERRIDES[@]}"})
if [[ "$DRY" -eq 1 ]]; then
    echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-} $(printf '%q ' "${CMD[@]}")"
    exit 0
fi
set -x
exec "${CMD[@]}"
