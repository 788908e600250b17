#!/usr/bin/env bash
# The body of scripts/slurm/train-*.sbatch (which exec it in the batch shell, so that it gets the batch shell's
# signals): parse the job's arguments, run scripts/slurm/launch.sh once per node with srun, and on the signal
# sent before the time limit let training save and requeue the job, which then resumes from checkpoint_last.pt.
#
#   sbatch scripts/slurm/train-Nnode(s).sbatch ROW DATA_BIN [SAVE_DIR] [options] [-- HYDRA_OVERRIDES...]
#
# Options:
#   --save-dir DIR        checkpoints and the hydra log (default: checkpoints/ROW; the same as a third positional)
#   --precision P         bf16 (default: bf16 autocast on fp32 master weights, train.sh --amp-bf16; A100/H100),
#                         fp16 (the configs' own fairseq fp16 with a loss scale; V100) or fp32
#   --compile             torch.compile every encoder and decoder layer (train.sh --compile; docs/compile.md)
#   --cudagraphs          --compile with its layers replayed as CUDA graphs over 8 length buckets (train.sh
#                         --cudagraphs; --batch-buckets N for another number)
#   --batch-buckets N     pad the sentences to one of N lengths (train.sh --batch-buckets, task.num_batch_buckets)
#   --tf32                fp32 matmuls on TF32 tensor cores (train.sh --tf32): for --precision fp32; under bf16
#                         autocast the matmuls are bf16 already and it changes next to nothing
#   --max-tokens T        T tokens per GPU per step, update_freq scaled the other way (train.sh --max-tokens; the
#                         tokens per update stay the row's: 38400 for the base rows on 80 GB cards)
#   -h, --help            this help
# Anything after "--" goes to train.sh after its "--" (hydra overrides, e.g. optimization.max_update=1000).
# Environment: GPUS_PER_NODE (default: SLURM_GPUS_ON_NODE, else 8; 0 trains on CPUs), MASTER_PORT,
# TRAIN_SH_DRY_RUN=1 (scripts/slurm/launch.sh).
#
# Preemption and resume: the sbatch scripts ask Slurm for SIGUSR1 to the batch shell 180 s before the time limit
# (--signal=B:USR1@180) and allow requeueing (--requeue). On it this script passes SIGUSR1 to srun, which passes it
# to every node's training; training finishes its update, saves checkpoint_last.pt (mid-epoch, with the data
# position) and stops (umst_plugin/training/preemption.py; SAVE_DIR/stopped-on-signal.json says so), and this
# script requeues the job (scontrol requeue). The requeued job runs the same command: fairseq resumes from
# SAVE_DIR/checkpoint_last.pt. Slurm checks time limits periodically (every 30 s in 22.05) and may send the warning
# up to a minute early: it can come while training is still starting, before it listens (launch.sh ignores the
# signal until then), so this script passes it on again every 5 s until training has stopped. The 180 s are what
# the save has: one update and the checkpoint's write.
# SIGTERM (a preemption, the time limit itself, scancel) goes from Slurm to every process of the job; training
# saves the same way if it can before SIGKILL (KillWait, 30 s by default, plus a partition's GraceTime on
# preemption). A preempted job is requeued by Slurm itself where the partition's PreemptMode is REQUEUE, and
# resumes the same way; after a time limit or scancel, submit the same command again to resume.
# CPUs: srun is given the job's --cpus-per-task (since Slurm 22.05 srun does not take it from sbatch; a cluster that
# binds tasks to cores would give each node's training one core), and launch.sh logs the CPUs each node's training
# may use.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

NODES=""; POSITIONAL=(); SAVE=""; PRECISION=bf16; TRAIN_ARGS=(); OVERRIDES=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --nodes) NODES="$2"; shift 2 ;;
        --save-dir) SAVE="${2:?--save-dir needs a directory}"; shift 2 ;;
        --save-dir=*) SAVE="${1#--save-dir=}"; shift ;;
        --precision) PRECISION="${2:-}"; shift 2 ;;
        --precision=*) PRECISION="${1#--precision=}"; shift ;;
        --compile|--tf32|--cudagraphs) TRAIN_ARGS+=("$1"); shift ;;
        --batch-buckets) TRAIN_ARGS+=(--batch-buckets "${2:?--batch-buckets needs a number of buckets}"); shift 2 ;;
        --batch-buckets=*) TRAIN_ARGS+=(--batch-buckets "${1#--batch-buckets=}"); shift ;;
        --max-tokens) TRAIN_ARGS+=(--max-tokens "${2:?--max-tokens needs a number of tokens}"); shift 2 ;;
        --max-tokens=*) TRAIN_ARGS+=(--max-tokens "${1#--max-tokens=}"); shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; OVERRIDES=("$@"); break ;;
        -*) echo "train-job: unknown option $1 (options: --save-dir, --precision, --compile, --cudagraphs," \
                 "--batch-buckets, --tf32, --max-tokens; other train.sh options are set by the job; hydra overrides after --)" >&2; exit 2 ;;
        *) POSITIONAL+=("$1"); shift ;;
    esac
done
[[ -n "$NODES" ]] || { echo "train-job: run by scripts/slurm/train-*.sbatch (--nodes N)" >&2; exit 2; }
if [[ ${#POSITIONAL[@]} -lt 2 || ${#POSITIONAL[@]} -gt 3 ]]; then
    echo "train-job: expected ROW DATA_BIN [SAVE_DIR], got ${#POSITIONAL[@]} positional argument(s): ${POSITIONAL[*]-}" >&2
    usage >&2; exit 2
fi
ROW="${POSITIONAL[0]}"; DATA="${POSITIONAL[1]}"
if [[ ${#POSITIONAL[@]} -eq 3 ]]; then
    [[ -z "$SAVE" ]] || { echo "train-job: SAVE_DIR given twice (${POSITIONAL[2]} and --save-dir $SAVE)" >&2; exit 2; }
    SAVE="${POSITIONAL[2]}"
fi
SAVE="${SAVE:-checkpoints/$ROW}"
case "$PRECISION" in
    bf16) TRAIN_ARGS+=(--amp-bf16) ;;
    fp16|fp32) ;;
    *) echo "train-job: --precision bf16, fp16 or fp32, not '$PRECISION'" >&2; exit 2 ;;
esac
if [[ "$PRECISION" == fp32 ]]; then
    OVERRIDES=(common.fp16=false ${OVERRIDES[@]+"${OVERRIDES[@]}"})  # the configs say fp16
fi
[[ -n "${SLURM_JOB_ID:-}" ]] || { echo "train-job: not in a Slurm job; submit with sbatch (or run scripts/train.sh)" >&2; exit 2; }
[[ ${#OVERRIDES[@]} -eq 0 ]] || TRAIN_ARGS+=(-- "${OVERRIDES[@]}")

MARKER="$SAVE/stopped-on-signal.json"  # written by training when it stopped on a signal (not at its end)
rm -f "$MARKER"
RESUME="a new run"
[[ ! -f "$SAVE/checkpoint_last.pt" ]] || RESUME="resuming from $SAVE/checkpoint_last.pt"
echo "[train-job] job ${SLURM_JOB_ID} (restart ${SLURM_RESTART_COUNT:-0}): $ROW on $NODES node(s) ${SLURM_JOB_NODELIST:-}," \
     "$PRECISION, $RESUME"

STOP=""
resend_usr1() {  # srun passes it to every task; again every 5 s until training has stopped or the step has ended
    ( while [[ ! -f "$MARKER" ]] && kill -USR1 "$SRUN" 2>/dev/null; do sleep 5; done ) &
}
on_usr1() {
    [[ "$STOP" != USR1 ]] || return 0
    STOP=USR1
    echo "[train-job] SIGUSR1 (the time limit is near): training saves checkpoint_last.pt at its next update and stops"
    [[ -z "${SRUN:-}" ]] || resend_usr1
}
on_term() {  # Slurm sends SIGTERM to every process itself; the batch shell only must not end before the steps
    STOP="${STOP:-TERM}"
    echo "[train-job] SIGTERM (preemption, time limit or scancel): training saves checkpoint_last.pt at its next" \
         "update if it can before SIGKILL"
}
trap on_usr1 USR1
trap on_term TERM
CPUS=()  # the job's CPUs per task for every task of the step (srun's own default is 1 since Slurm 22.05)
[[ -z "${SLURM_CPUS_PER_TASK:-}" ]] || CPUS=(--cpus-per-task="$SLURM_CPUS_PER_TASK")
# srun in the background: bash runs a trap only between commands, and `wait` is interrupted by a trapped signal
srun --nodes="$NODES" --ntasks-per-node=1 ${CPUS[@]+"${CPUS[@]}"} --kill-on-bad-exit=1 \
    bash "$ROOT/scripts/slurm/launch.sh" "$ROW" "$DATA" "$SAVE" "${TRAIN_ARGS[@]}" &
SRUN=$!
[[ "$STOP" != USR1 ]] || resend_usr1  # (the warning came before srun started)
while kill -0 "$SRUN" 2>/dev/null; do wait "$SRUN" || true; done
STATUS=0; wait "$SRUN" || STATUS=$?

if [[ "$STOP" == USR1 && "$STATUS" -eq 0 && -f "$MARKER" ]]; then
    echo "[train-job] training stopped at $(cat "$MARKER"); requeueing job $SLURM_JOB_ID: it resumes from" \
         "$SAVE/checkpoint_last.pt"
    scontrol requeue "$SLURM_JOB_ID"
elif [[ "$STOP" == USR1 && "$STATUS" -eq 0 ]]; then
    echo "[train-job] SIGUSR1 came after the last update: training is complete, no requeue"
elif [[ -n "$STOP" ]]; then
    echo "[train-job] training ended with status $STATUS after SIGTERM or a failure; not requeued by this script" \
         "(Slurm requeues a preempted job itself where the partition's PreemptMode is REQUEUE)" >&2
fi
exit "$STATUS"
