#!/usr/bin/env bash
# Train one table row: fairseq-hydra-train with configs/ROW.yaml and the plugin as common.user_dir
# (plain fairseq-hydra-train works too; this script adds the GPU-count scaling below).
#
#   bash scripts/train.sh ROW --data DATA_BIN [--save-dir DIR] [--gpus G] [--amp-bf16] [--compile] [--tf32]
#        [--cudagraphs] [--batch-buckets N] [--max-tokens T] [--dry-run] [--nnodes N --node-rank R --master-addr HOST [--master-port PORT]]
#        [-- HYDRA_OVERRIDES...]
#   bash scripts/train.sh umst-t2-umst-base --data data/wmt14_en_de/data-bin/wmt14_en_de_bpe32000 --amp-bf16
#
# Each config notes the GPU count its batch assumes (8 for UMST/TranSFormer/MSC rows, 4 for the Prime WMT
# rows). On N machines x G GPUs this script multiplies update_freq by ASSUMED/(N*G) so the tokens per update
# stay the paper's. Without a GPU it trains on the CPU in fp32 (only sensible for smoke tests), one process
# per machine, the config's update_freq split over the machines (gloo). Several machines: run the same
# command on each with --node-rank 0..N-1 (fairseq's own tcp:// rendezvous at HOST:PORT, default port
# 29500); each machine uses exactly --gpus devices (CUDA_VISIBLE_DEVICES: its first G), so the ranks of
# machine R are R*G .. R*G+G-1 and never overlap another machine's.
#   --amp-bf16   bf16 autocast on fp32 master weights (--amp --amp-dtype bfloat16; the choice on A100/H100)
#                instead of the configs' fp16 (V100). fairseq's own --bf16 (pure bf16 weights) is another
#                thing, which train.sh does not offer: --bf16 is refused with this explanation.
#   --compile    torch.compile every encoder and decoder layer (docs/compile.md).
#   --cudagraphs --compile, its layers replayed as CUDA graphs (--compile-cudagraphs) over length buckets: the
#                sentences padded to one of --batch-buckets N lengths (default 8, task.num_batch_buckets), so
#                that a graph recorded for a batch shape is replayed, not recorded again (docs/compile.md). No
#                effect on a CPU but the buckets (a warning: compiled without graphs).
#   --batch-buckets N  the number of length buckets (fairseq's --num-batch-buckets) with or without --cudagraphs.
#   --tf32       fp32 matmuls on TF32 tensor cores; changes only what runs in fp32 (none of the model's
#                matmuls under --amp-bf16 or fp16).
#   --max-tokens T  tokens per GPU per step instead of the config's; update_freq scales the other way, so the
#                tokens per update stay the row's (e.g. 38400 on 80 GB cards: docs/wmt-on-gpus.md).
#   --dry-run    print the command and its environment, run nothing.
# After "--": hydra overrides, e.g. "-- optimization.max_update=10 dataset.max_tokens=500". A key the row's
# YAML does not set is added (train.sh writes it as hydra's ++KEY=VALUE), so model.encoder_layers=2 or
# optimizer.use_old_adam=true need no "+"; a model.* key must still be a flag of the row's arch (checked when
# it trains, not by --dry-run) and other groups' keys are checked by fairseq, so a misspelt key still stops the
# run. An optimization.update_freq or distributed_world_size there replaces the config's before the scaling.
# Checkpoints and the hydra log go to --save-dir (default checkpoints/ROW). Python: $PYTHON, else the active
# virtualenv, else .venv.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/lib/env.sh"  # find_python: $PYTHON, the active venv, else .venv (no activation needed)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the plugin from this checkout, installed or not

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
[[ $# -ge 1 && "$1" != -h && "$1" != --help ]] || { usage; exit 0; }
ROW="$1"; shift
DATA=""; SAVE="checkpoints/$ROW"; GPUS=""; OVERRIDES=(); BF16=0; DRY=0; COMPILE=0; TF32=0; MAX_TOKENS=""
CUDAGRAPHS=0; BUCKETS=""
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
        --cudagraphs) COMPILE=1; CUDAGRAPHS=1; shift ;;
        --batch-buckets) BUCKETS="$2"; shift 2 ;;
        --max-tokens) MAX_TOKENS="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
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
[[ -z "$MAX_TOKENS" || "$MAX_TOKENS" =~ ^[1-9][0-9]*$ ]] || { echo "--max-tokens $MAX_TOKENS: expected a number of tokens" >&2; exit 2; }
[[ -z "$BUCKETS" || "$BUCKETS" =~ ^[1-9][0-9]*$ ]] || { echo "--batch-buckets $BUCKETS: expected a number of buckets (1 or more)" >&2; exit 2; }
for o in ${OVERRIDES[@]+"${OVERRIDES[@]}"}; do
    if [[ "$o" =~ ^[+~]*task\.num_batch_buckets= && ( -n "$BUCKETS" || "$CUDAGRAPHS" -eq 1 ) ]]; then
        echo "train.sh: $o and --batch-buckets/--cudagraphs both set the buckets; give one (--batch-buckets N)" >&2; exit 2
    fi
done
# The batch the row asks for: the config's GPU count, update_freq and max_tokens, unless the overrides replace
# them (update_freq and the world size are consumed here and passed on scaled); and the overrides as hydra
# gets them: a key the YAML does not set becomes ++KEY=VALUE (model.* keys checked against the arch's flags).
PLAN=()
while IFS= read -r -d '' line; do PLAN+=("$line"); done < <("$PY" - "$DRY" "$CONFIG" ${OVERRIDES[@]+"${OVERRIDES[@]}"} <<'EOF'
import sys
dry_run = sys.argv.pop(1) == "1"
from omegaconf import OmegaConf
cfg = OmegaConf.load(sys.argv[1])
keys = ("optimization.update_freq", "distributed_training.distributed_world_size")
overrides = sys.argv[2:]
dots = [o.lstrip("+") for o in overrides if o.lstrip("+").split("=", 1)[0] in keys]
batch = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dots))
out = [f"{batch.distributed_training.distributed_world_size} {batch.optimization.update_freq[0]} "
       f"{batch.dataset.get('max_tokens') or 0}"]
# Groups whose YAML node hydra composes untyped, so that it refuses a key the YAML does not set; fairseq
# checks the optimizer's, scheduler's and criterion's keys against their dataclasses when it builds them.
LOOSE = ("model", "optimizer", "lr_scheduler", "criterion")
added_model_keys = []
for o in overrides:
    key, eq, _ = o.partition("=")
    group, _, name = key.partition(".")
    if eq and key[:1] not in "+~" and group in LOOSE and name and \
            OmegaConf.select(cfg, key, default="<absent>") == "<absent>":
        out.append("++" + o)
        if group == "model":
            added_model_keys.append(name)
    else:
        out.append(o)
if added_model_keys and dry_run:  # (checking imports fairseq: seconds, nothing beside a training's start-up)
    print(f"[train.sh] {', '.join('model.' + k for k in added_model_keys)}: added to the row's model; checked "
          f"against the flags of {cfg.model._name} when it trains", file=sys.stderr)
elif added_model_keys:  # a misspelt model key would be added silently: it must be a flag of the arch
    import argparse

    import umst_plugin  # noqa: F401  (registers the plugin's archs)
    from fairseq.models import ARCH_MODEL_REGISTRY

    arch = cfg.model._name
    parser = argparse.ArgumentParser(add_help=False, conflict_handler="resolve")
    ARCH_MODEL_REGISTRY[arch].add_args(parser)
    known = {a.dest for a in parser._actions}
    unknown = [k for k in added_model_keys if k not in known]
    if unknown:
        sys.exit(f"train.sh: {', '.join('model.' + k for k in unknown)}: not a flag of arch {arch} "
                 f"({sys.argv[1]}); expected one of its --flags with - as _, e.g. model.encoder_layers")
sys.stdout.write("".join(line + "\0" for line in out))
EOF
)
[[ ${#PLAN[@]} -ge 1 ]] || exit 2  # (the Python above said why)
read -r ASSUMED UF CONFIG_MAX_TOKENS <<< "${PLAN[0]}"
KEPT=()
for o in "${PLAN[@]:1}"; do
    case "${o#+}" in optimization.update_freq=*|distributed_training.distributed_world_size=*) ;; *) KEPT+=("$o") ;; esac
done
OVERRIDES=(${KEPT[@]+"${KEPT[@]}"})
if [[ -n "$MAX_TOKENS" ]]; then
    (( CONFIG_MAX_TOKENS > 0 )) || { echo "--max-tokens: $ROW sets no dataset.max_tokens to scale from" >&2; exit 2; }
    OVERRIDES+=("dataset.max_tokens=$MAX_TOKENS")
fi
ARGS=()
if [[ "$GPUS" -gt 0 && -n "$MAX_TOKENS" ]]; then
    # T tokens per GPU per step instead of the config's: the row's tokens per update (its max_tokens x update_freq x
    # GPUs) over T x the GPUs here, in one division, so that a batch per card larger than the config's whole
    # update_freq on its own GPUs (MSC's 65,536 tokens on one card: 32,768 x 2) stays exact
    WORLD=$(( NNODES * GPUS )); TOKENS=$(( CONFIG_MAX_TOKENS * UF * ASSUMED ))
    NEW_UF=$(( TOKENS / (MAX_TOKENS * WORLD) )); [[ "$NEW_UF" -ge 1 ]] || NEW_UF=1
    if (( NEW_UF * MAX_TOKENS * WORLD != TOKENS )); then
        echo "[train.sh] WARNING: the row's $TOKENS tokens per update are not --max-tokens $MAX_TOKENS x $WORLD GPUs x" \
             "a whole update_freq; the batch differs from the paper's ($(( NEW_UF * MAX_TOKENS * WORLD )) tokens;" \
             "python -m umst_tools.batch_table --cards lists exact ones)" >&2
    fi
    echo "[train.sh] $ROW: $CONFIG_MAX_TOKENS tokens x update_freq $UF x $ASSUMED GPUs = $TOKENS per update; running" \
         "on $NNODES machine(s) x $GPUS GPUs x --max-tokens $MAX_TOKENS x update_freq $NEW_UF" >&2
    SCALED_UF="$NEW_UF"
elif [[ -n "$MAX_TOKENS" ]]; then
    # (CPU) T tokens per step instead of the config's: update_freq x CONFIG_MAX_TOKENS / T keeps the tokens per update
    if (( UF * CONFIG_MAX_TOKENS % MAX_TOKENS != 0 )); then
        echo "[train.sh] WARNING: update_freq $UF x $CONFIG_MAX_TOKENS tokens is not a multiple of --max-tokens $MAX_TOKENS; the batch differs" >&2
    fi
    NEW=$(( UF * CONFIG_MAX_TOKENS / MAX_TOKENS )); (( NEW >= 1 )) || NEW=1
    echo "[train.sh] --max-tokens $MAX_TOKENS: $CONFIG_MAX_TOKENS tokens x update_freq $UF -> $MAX_TOKENS x $NEW" >&2
    UF="$NEW"
fi
if [[ "$GPUS" -eq 0 ]]; then
    # CPU: one process per machine; the config's update_freq is the batch of all of them together.
    WORLD="$NNODES"; NEW_UF=$(( UF / WORLD )); [[ "$NEW_UF" -ge 1 ]] || NEW_UF=1
    if (( NEW_UF * WORLD != UF )); then
        echo "[train.sh] WARNING: update_freq $UF is not divisible by $WORLD machines; the batch differs" >&2
    fi
    PRECISION="fp32"; [[ "$BF16" -eq 0 ]] || PRECISION="bf16 autocast (--amp-bf16)"
    echo "[train.sh] $ROW assumes $ASSUMED GPUs; no GPU: CPU, $PRECISION, $WORLD process(es) x update_freq $NEW_UF (smoke tests only)" >&2
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
    if [[ -n "${SCALED_UF:-}" ]]; then
        NEW_UF="$SCALED_UF"  # (--max-tokens: scaled above, from the row's tokens per update)
    else
        NEW_UF=$(( UF * ASSUMED / WORLD )); [[ "$NEW_UF" -ge 1 ]] || NEW_UF=1
        if (( UF * ASSUMED != NEW_UF * WORLD )); then
            echo "[train.sh] WARNING: $ASSUMED x $UF is not divisible by $WORLD GPUs; the batch differs from the paper's" >&2
        fi
        echo "[train.sh] $ROW assumes $ASSUMED GPUs x update_freq $UF; running on $NNODES machine(s) x $GPUS GPUs x update_freq $NEW_UF" >&2
    fi
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
[[ "$CUDAGRAPHS" -eq 0 ]] || ARGS+=(+common.compile_cudagraphs=true)
# CUDA graphs replay a recorded shape only: pad the sentences to a bounded set of lengths (the speed table's 8)
[[ -n "$BUCKETS" || "$CUDAGRAPHS" -eq 0 ]] || BUCKETS=8
# ("++": the rows' YAML task nodes set no num_batch_buckets, and hydra refuses a key they do not set)
[[ -z "$BUCKETS" ]] || ARGS+=(++task.num_batch_buckets="$BUCKETS")

CMD=("$PY" -m fairseq_cli.hydra_train --config-dir "$ROOT/configs" --config-name "$ROW"
     task.data="$DATA" common.user_dir="$ROOT/umst_plugin" checkpoint.save_dir="$SAVE" hydra.run.dir="$SAVE"
     "${ARGS[@]}" ${OVERRIDES[@]+"${OVERRIDES[@]}"})
if [[ "$DRY" -eq 1 ]]; then
    echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-} $(printf '%q ' "${CMD[@]}")"
    exit 0
fi
set -x
exec "${CMD[@]}"
