#!/usr/bin/env bash
# Run by srun on every node of a Slurm job (scripts/slurm/train-job.sh, from train-*.sbatch): one scripts/train.sh
# per node, with this node's rank, the job's first node as the rendezvous host and every GPU Slurm gave the node.
#   ROW DATA_BIN SAVE_DIR [extra train.sh arguments ...]   (train-job.sh adds --amp-bf16 for --precision bf16)
# Environment: GPUS_PER_NODE (default: SLURM_GPUS_ON_NODE, else 8; 0: CPUs), MASTER_PORT (default: 20000 + job id
# mod 20000), TRAIN_SH_DRY_RUN=1 (train.sh --dry-run: print each node's command instead of training).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ROW="${1:?usage: launch.sh ROW DATA_BIN SAVE_DIR [train.sh args]}"; DATA="${2:?DATA_BIN}"; SAVE="${3:?SAVE_DIR}"
shift 3
GPUS="${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}"
# The first host, without a pipe into head: under pipefail, scontrol killed by SIGPIPE once head has its line
# (a race that grows with the node count) would end the job with status 141.
HOSTS="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
MASTER_ADDR="${HOSTS%%$'\n'*}"
MASTER_PORT="${MASTER_PORT:-$(( 20000 + SLURM_JOB_ID % 20000 ))}"
# The CPUs this node's training may use (its processes inherit them: the GPU workers fairseq spawns and their data
# loaders): what srun bound the task to, which is the job's --cpus-per-task only if srun was given it.
CPUS="$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status 2>/dev/null || true)"
NCPUS="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 0)"  # (nproc counts OMP_NUM_THREADS)
echo "[launch] node ${SLURMD_NODENAME:-$(hostname -s)} (rank $SLURM_NODEID of $SLURM_NNODES): CPU affinity" \
     "${CPUS:-unknown} ($NCPUS CPUs; the job asked --cpus-per-task ${SLURM_CPUS_PER_TASK:-(none)})" >&2
if [[ -n "${SLURM_CPUS_PER_TASK:-}" ]] && (( NCPUS < SLURM_CPUS_PER_TASK )); then
    echo "[launch] WARNING: $NCPUS CPUs for this node's training, not the $SLURM_CPUS_PER_TASK the job asked for" \
         "(srun without --cpus-per-task on a cluster that binds tasks to cores)" >&2
fi
EXTRA=()
[[ "${TRAIN_SH_DRY_RUN:-0}" != 1 ]] || EXTRA+=(--dry-run)
# SIGUSR1 and SIGTERM ignored from here until training installs its handlers (umst_plugin/training/preemption.py;
# an ignored signal stays ignored across exec): a signal during start-up neither kills a node's training alone nor
# its parent process while the GPU workers it spawns save (Slurm sends SIGTERM to every process of the step).
trap '' USR1 TERM
exec bash "$ROOT/scripts/train.sh" "$ROW" --data "$DATA" --save-dir "$SAVE" --gpus "$GPUS" \
    --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    ${EXTRA[@]+"${EXTRA[@]}"} "$@"
