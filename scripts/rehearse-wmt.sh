#!/usr/bin/env bash
# Rehearse the WMT14 En-De recipe on this machine, as a cluster user runs it, before spending cluster hours: the
# user's own commands from docs/wmt-on-gpus.md, through Slurm itself -- its daemons started here, a cluster of two
# nodes with a slurm.conf of its own (umst_tools/local_slurm.py) -- on a stand-in corpus (a few thousand Multi30k
# pairs in the WMT14 download's layout), at tiny width on CPUs.
#
#   bash scripts/rehearse-wmt.sh [--work-dir DIR] [--multi30k DIR] [--train-seconds S]
#
# Needs Slurm (Debian's slurm-wlm and munge; scripts/setup_env.sh installs them when run as root) and root (the
# cluster's slurmd runs the jobs): where it cannot run, it says why in one line and exits 3.
# It starts from `env -i` (nothing active: no venv, no PYTHON, no PYTHONPATH), starts munged, slurmctld and two
# slurmd (nodes n1 and n2, this machine's CPUs each; WORK/slurm), stops them on exit however it exits, and runs:
#   1. prepare-wmt14-en-de.sh --parse-shards 2; the parse as a Slurm array, one shard at a time (--array=1-2%1,
#      scripts/slurm/parse-array.sbatch); prepare again, which merges the shards;
#   2. umst-t2-umst-base on 2 nodes (train-2nodes.sbatch) in the preemptable partition (standby) with a 4-minute
#      time limit and the sbatch script's own warning (--signal=B:USR1@180), one CPU per node, training for S
#      seconds (fairseq's stop_time_hours, counted over every run of the job);
#   3. at its update 40, the transformer baseline umst-t2-transformer-base on 1 node with 2 CPUs in the default
#      partition: it preempts the 2-node run (SIGTERM: training saves checkpoint_last.pt; Slurm requeues the job,
#      which starts again by itself once its hold has passed and resumes); Slurm's warning of the time limit comes
#      from its own timer, 30-60 s into each run: training saves, the job requeues itself and resumes -- as many
#      times as the warning comes before training ends;
#   4. umst-t2-umst-base on 1 node (train-1node.sbatch), uninterrupted, to the update the 2-node run ended at; its
#      losses against the 2-node run's, every update (umst_tools.rehearsal compare: the reference is one process
#      with the same batch as the 2 nodes' two, so this is also the check that 2 nodes train as 1); every node's
#      CPU affinity against its job's --cpus-per-task;
#   5. umst-average-checkpoints, evaluate.sh (compound-split tokenized BLEU, sacreBLEU), collect_results.py;
#   6. one raw sentence translated from Python with umst_plugin.from_pretrained, no parser argument.
# Any step that fails stops the rehearsal with its log named. Output: WORK/rehearsal.json (the Slurm version, the
# CPU, what each step measured and how long it took), WORK/logs/ (every job's log), WORK/results.md (the table).
# Defaults: --work-dir a new directory under ${TMPDIR:-/tmp}; --multi30k ../shared/data/multi30k (Multi30k's raw
# *.gz files: scripts/prepare-multi30k.sh downloads them into data/multi30k/raw); --train-seconds 66 (the
# warning, 30-60 s after a start, must come while training runs, whatever the machine's speed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

WORK=""; MULTI30K=""; TRAIN_SECONDS=66
while [[ $# -gt 0 ]]; do
    case "$1" in
        --work-dir) WORK="$2"; shift 2 ;;
        --multi30k) MULTI30K="$2"; shift 2 ;;
        --train-seconds) TRAIN_SECONDS="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "rehearse-wmt: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done
[[ "$TRAIN_SECONDS" =~ ^[1-9][0-9]*$ ]] || { echo "rehearse-wmt: --train-seconds $TRAIN_SECONDS: expected whole seconds" >&2; exit 2; }
if [[ -z "${UMST_REHEARSAL_BARE:-}" ]]; then
    cd "$ROOT"
    rc=0; WHY="$(python3 -m umst_tools.local_slurm check 2>&1)" || rc=$?
    [[ "$rc" -ne 3 ]] || { echo "rehearse-wmt: Slurm cannot run here: $WHY" >&2; exit 3; }
    [[ "$rc" -eq 0 ]] || { echo "rehearse-wmt: python3 -m umst_tools.local_slurm check failed (exit $rc): $WHY" >&2; exit 2; }
    WORK="${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/umst-rehearsal.XXXXXX")}"
    mkdir -p "$WORK"; WORK="$(cd "$WORK" && pwd)"
    if [[ -z "$MULTI30K" ]]; then
        for d in "$ROOT/../shared/data/multi30k" "$ROOT/data/multi30k/raw"; do [[ -f "$d/train.en.gz" ]] && MULTI30K="$d" && break; done
    fi
    [[ -n "$MULTI30K" && -f "$MULTI30K/train.en.gz" ]] || {
        echo "rehearse-wmt: no Multi30k raw files (train.en.gz ...); give --multi30k DIR (bash scripts/prepare-multi30k.sh downloads them)" >&2
        exit 2; }
    MULTI30K="$(cd "$MULTI30K" && pwd)"
    # a login shell's environment and nothing else (the Slurm daemons are in sbin, which a user's PATH may lack:
    # umst_tools/local_slurm.py finds them there)
    exec env -i HOME="${HOME:-/root}" USER="${USER:-$(id -un)}" LANG=C.UTF-8 TMPDIR="${TMPDIR:-/tmp}" \
        PATH="/usr/local/bin:/usr/bin:/bin" UMST_REHEARSAL_BARE=1 \
        bash "${BASH_SOURCE[0]}" --work-dir "$WORK" --multi30k "$MULTI30K" --train-seconds "$TRAIN_SECONDS"
fi

LOGS="$WORK/logs"; CK="$WORK/checkpoints"; RECORD="$WORK/steps.tsv"; JOBS="$WORK/jobs.tsv"
mkdir -p "$LOGS" "$CK"; : > "$RECORD"; : > "$JOBS"
cd "$ROOT"  # the user submits from the repository root (the jobs read $SLURM_SUBMIT_DIR)
START=$(date +%s.%N); T0="$START"
read -r _ CPU_BUSY0 CPU_ALL0 < <(awk '/^cpu / { busy = $2 + $3 + $4 + $7 + $8; print "cpu", busy, busy + $5 + $6; exit }' /proc/stat)
step() {  # step NAME: the time since the previous one goes to steps.tsv
    local now; now=$(date +%s.%N)
    awk -v name="$1" -v a="$T0" -v b="$now" 'BEGIN { printf "%s\t%.1f\n", name, b - a }' >> "$RECORD"; T0="$now"
    echo "== rehearse-wmt: $1 done"
}
fail() { echo "rehearse-wmt: FAILED: $*" >&2; exit 1; }

# ---- 0. the cluster: Slurm's own daemons, stopped on exit (and by a watcher if this shell is killed outright) ----
SLURM_DIR="$WORK/slurm"
stop_cluster() {
    local status=$?
    trap - EXIT
    python3 -m umst_tools.local_slurm stop "$SLURM_DIR" \
        || echo "rehearse-wmt: WARNING: processes of the local cluster were left running (above)" >&2
    exit "$status"
}
trap stop_cluster EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
rc=0; OUT="$(python3 -m umst_tools.local_slurm start "$SLURM_DIR" --watch $$ 2>&1)" || rc=$?
[[ "$rc" -ne 3 ]] || { echo "rehearse-wmt: Slurm cannot run here: $OUT" >&2; exit 3; }
[[ "$rc" -eq 0 ]] || fail "the local Slurm cluster did not start: $OUT"
export SLURM_CONF="$SLURM_DIR/slurm.conf"
SLURM_VERSION="$(sbatch --version)"
echo "== rehearse-wmt: $SLURM_VERSION; cluster in $SLURM_DIR: $(sinfo -h -o '%P %D %N' | tr '\n' ' ')"
step slurm

job_field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
wait_jobs() {  # as a user waits: each job's state every 2 s until every one has ended; their end to jobs.tsv
    local waiting=("$@") left j state
    while [[ ${#waiting[@]} -gt 0 ]]; do
        left=()
        for j in "${waiting[@]}"; do
            state="$(job_field "$j" JobState)"
            case "$state" in
                COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|DEADLINE|BOOT_FAIL|"")
                    printf '%s\t%s\t%s\t%s\n' "$j" "$(job_field "$j" JobName)" "${state:-GONE}" \
                        "$(job_field "$j" Restarts)" >> "$JOBS" ;;
                *) left+=("$j") ;;  # pending (a requeued job too: held until its BeginTime), running, completing
            esac
        done
        waiting=(${left[@]+"${left[@]}"})
        [[ ${#waiting[@]} -eq 0 ]] || sleep 2
    done
}
job_state() { awk -F'\t' -v j="$1" '$1 == j { s = $3 } END { print s }' "$JOBS"; }
export OMP_NUM_THREADS=1  # one thread per process: the 2 "nodes" and the other jobs share this machine's cores
export GPUS_PER_NODE=0    # the nodes are CPUs (launch.sh's train.sh --gpus 0: fp32 over gloo)

# ---- 1. data: the stand-in download, prepare, the parse as a Slurm array, prepare again (merge) ----------------
python3 -m umst_tools.rehearsal standin --multi30k "$MULTI30K" --raw-dir "$WORK/raw" --train 2000 --valid 40 --test 40
PREP=(--raw-dir "$WORK/raw" --work-dir "$WORK/data" --bpe-merges 1000 --parser spacy
      --parser-args "--chunk-size 1000" --parse-shards 2 --workers 2)
bash scripts/prepare-wmt14-en-de.sh "${PREP[@]}" > "$LOGS/prepare-1.log" 2>&1 || fail "prepare (see $LOGS/prepare-1.log)"
step prepare
# (parse-array.sbatch asks 4 CPUs; these nodes may have fewer: a task asks 1, and runs one at a time)
sbatch --wait --array=1-2%1 --cpus-per-task=1 --output="$LOGS/%x-%A_%a.out" scripts/slurm/parse-array.sbatch \
    wmt14-en-de "${PREP[@]}" > "$LOGS/parse-array-submit.log" 2>&1 \
    || fail "the parse array ($LOGS/parse-array-submit.log, $LOGS/umst-parse-*.out)"
step parse-array
bash scripts/prepare-wmt14-en-de.sh "${PREP[@]}" > "$LOGS/prepare-2.log" 2>&1 || fail "prepare after the parse (see $LOGS/prepare-2.log)"
grep -q "merging the 2 parse shards" "$LOGS/prepare-2.log" || fail "the second prepare did not merge the shards ($LOGS/prepare-2.log)"
D="$WORK/data/data-bin/wmt14_en_de_bpe1000"
[[ -n "$(ls "$D"/train.en-de.en.*heads* 2>/dev/null)" ]] || fail "no dependency side data in $D"
step merge

# ---- 2.-3. train: tiny width, no dropout (the 2-node run and the 1-node reference compute the same function) ----
TINY=(+model.encoder_layers=1 +model.decoder_layers=1 +model.encoder_embed_dim=32 +model.decoder_embed_dim=32
      +model.encoder_ffn_embed_dim=64 +model.decoder_ffn_embed_dim=64 +model.encoder_attention_heads=2
      +model.decoder_attention_heads=2 model.dropout=0.0 model.attention_dropout=0.0 model.activation_dropout=0.0
      dataset.max_tokens=1024 "optimization.update_freq=[2]" lr_scheduler.warmup_updates=10 common.log_interval=1
      dataset.num_workers=0 dataset.disable_validation=true checkpoint.save_interval_updates=10
      checkpoint.keep_interval_updates=5 checkpoint.no_epoch_checkpoints=true)
SUBMIT=(sbatch --parsable --gres=none --output="$LOGS/%x-%j.out")
STOP_HOURS="$(awk -v s="$TRAIN_SECONDS" 'BEGIN { printf "%.6f", s / 3600 }')"
UMST=$("${SUBMIT[@]}" --job-name=umst-2nodes --partition=standby --time=4 --cpus-per-task=1 \
       scripts/slurm/train-2nodes.sbatch umst-t2-umst-base "$D" --save-dir "$CK/umst-2nodes" --precision fp32 \
       -- "${TINY[@]}" optimization.max_update=1000000 optimization.stop_time_hours="$STOP_HOURS")
UMST_LOG="$LOGS/umst-2nodes-$UMST.out"
PREEMPT_AT=40
python3 -m umst_tools.rehearsal wait-for-update "$UMST_LOG" "$PREEMPT_AT" --timeout 300 >/dev/null \
    || fail "the 2-node run did not reach update $PREEMPT_AT ($UMST_LOG)"
step start-2nodes
BASELINE=$("${SUBMIT[@]}" --job-name=transformer-1node --cpus-per-task=2 scripts/slurm/train-1node.sbatch \
           umst-t2-transformer-base "$D" --save-dir "$CK/transformer-1node" --precision fp32 -- "${TINY[@]}" \
           optimization.max_update=20)
for _ in $(seq 300); do [[ "$(job_field "$UMST" Restarts)" -ge 1 ]] && break; sleep 0.2; done
[[ "$(job_field "$UMST" Restarts)" -ge 1 ]] || fail "job $UMST was not preempted by job $BASELINE ($UMST_LOG)"
step preemption
wait_jobs "$UMST" "$BASELINE"
for j in "$UMST" "$BASELINE"; do
    [[ "$(job_state "$j")" == COMPLETED ]] || fail "job $j ended $(job_state "$j") ($LOGS/*-$j.out)"
done
step train-2nodes
UPDATES="$(.venv/bin/python -m umst_tools.rehearsal last-update "$CK/umst-2nodes")"
REFERENCE=$("${SUBMIT[@]}" --job-name=umst-reference --cpus-per-task=1 scripts/slurm/train-1node.sbatch \
            umst-t2-umst-base "$D" --save-dir "$CK/umst-reference" --precision fp32 -- "${TINY[@]}" \
            optimization.max_update="$UPDATES")
wait_jobs "$REFERENCE"
[[ "$(job_state "$REFERENCE")" == COMPLETED ]] || fail "job $REFERENCE ended $(job_state "$REFERENCE") ($LOGS/umst-reference-$REFERENCE.out)"
step train-reference

# ---- 4. resumed against uninterrupted; the CPUs each node's training got ---------------------------------------
.venv/bin/python -m umst_tools.rehearsal compare --preempted "$CK/umst-2nodes" --log "$UMST_LOG" \
    --reference "$CK/umst-reference" --reference-log "$LOGS/umst-reference-$REFERENCE.out" --tolerance 1e-4 \
    --json "$WORK/resume.json" > "$LOGS/compare.log" || fail "the resumed run differs from the reference ($WORK/resume.json)"
grep -q "DUE TO PREEMPTION" "$UMST_LOG" && grep -q "Stopping training on SIGTERM" "$UMST_LOG" \
    || fail "no preemption and save on SIGTERM in $UMST_LOG"
grep -q "requeueing job $UMST" "$UMST_LOG" && grep -q "Stopping training on SIGUSR1" "$UMST_LOG" \
    || fail "no time-limit warning, save and requeue in $UMST_LOG"
for log in "$UMST_LOG" "$LOGS/transformer-1node-$BASELINE.out" "$LOGS/umst-reference-$REFERENCE.out"; do
    bad="$(sed -n 's/.*CPU affinity .* (\([0-9]*\) CPUs; the job asked --cpus-per-task \([0-9]*\)).*/\1 \2/p' "$log" \
           | awk '$1 != $2' | head -n 1)"
    [[ -z "$bad" ]] || fail "a node's training got CPUs other than its job's --cpus-per-task ($bad) in $log"
    grep -q "CPU affinity" "$log" || fail "no CPU affinity logged in $log"
done
step compare

# ---- 5. average, evaluate, collect (docs/recipes.md, section 2) -----------------------------------------------------
average_and_evaluate() {  # ROW SAVE_DIR: the two rows side by side, as from two shells
    .venv/bin/umst-average-checkpoints --inputs "$2" --num-update-checkpoints 2 --output "$2/checkpoint_avg2.pt" \
        > "$LOGS/average-$1.log" 2>&1 || { echo "averaging $2 failed ($LOGS/average-$1.log)" >&2; return 1; }
    bash scripts/evaluate.sh --data "$D" --checkpoint "$2/checkpoint_avg2.pt" --row "$1" --max-tokens 4096 \
        > "$LOGS/evaluate-$1.log" 2>&1 || { echo "evaluate.sh $1 failed ($LOGS/evaluate-$1.log)" >&2; return 1; }
}
average_and_evaluate umst-t2-umst-base "$CK/umst-2nodes" & A=$!
average_and_evaluate umst-t2-transformer-base "$CK/transformer-1node" & B=$!
wait "$A" || fail "average and evaluate umst-t2-umst-base"
wait "$B" || fail "average and evaluate umst-t2-transformer-base"
step average-evaluate
rm -rf "$CK/umst-reference"  # not a table row: collected would be a second umst-t2-umst-base
.venv/bin/python scripts/collect_results.py "$CK" --output "$WORK/results.md" > "$LOGS/collect.log" 2>&1 \
    || fail "collect_results.py ($LOGS/collect.log)"
step collect

# ---- 6. one raw sentence from Python (docs/inference.md): no parser argument, the data-bin records it ------------
.venv/bin/python - "$CK/umst-2nodes" "$D" "$WORK/translation.json" > "$LOGS/translate.log" 2>&1 <<'EOF' \
    || fail "from_pretrained ($LOGS/translate.log)"
import json, sys
import umst_plugin

model = umst_plugin.from_pretrained(sys.argv[1], checkpoint_file="checkpoint_avg2.pt", data_name_or_path=sys.argv[2])
sentence = "A man in an orange hat starring at something."
parser = getattr(model.task.cfg, "source_parser", None)
with open(sys.argv[3], "w") as f:
    json.dump({"source": sentence, "translation": model.translate(sentence), "source_parser": parser,
               "source_parser_model": getattr(model.task.cfg, "source_parser_model", None)}, f)
EOF
step translate

# CPU time: this shell's commands (bash's `times`, its children's line; the jobs run under slurmstepd, not here)
# and the whole machine's busy CPU time over the run (/proc/stat: the jobs, the daemons, and anything else running)
times > "$WORK/times.txt"  # (not in a pipe: a subshell's `times` has no children)
COMMANDS_CPU=$(tail -n 1 "$WORK/times.txt" | awk '{ split($1, u, "m"); split($2, s, "m"); print u[1] * 60 + u[2] + s[1] * 60 + s[2] }')
read -r _ CPU_BUSY1 CPU_ALL1 < <(awk '/^cpu / { busy = $2 + $3 + $4 + $7 + $8; print "cpu", busy, busy + $5 + $6; exit }' /proc/stat)
MACHINE_CPU=$(awk -v a="$CPU_BUSY0" -v b="$CPU_BUSY1" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", (b - a) / hz }')
CPU_MODEL="$(awk -F': ' '/^model name/ { m = $2 } /^cpu family/ { f = $2 } /^model\t/ { n = $2 }
                        /^flags/ { x = ($2 ~ /avx512_bf16/ ? "; avx512_bf16" : "") ($2 ~ /amx_tile/ ? ", AMX" : "") }
                        /^$/ { exit } END { printf "%s (family %s, model %s%s)", m, f, n, x }' /proc/cpuinfo)"
python3 - "$WORK" "$UMST" "$REFERENCE" "$BASELINE" "$COMMANDS_CPU" "$MACHINE_CPU" "$SLURM_VERSION" "$CPU_MODEL" \
    "$(env -u OMP_NUM_THREADS nproc)" "$TRAIN_SECONDS" "$START" <<'EOF'
import json, os, sys, time
work, umst, reference, baseline, commands_cpu, machine_cpu, slurm, cpu, cores, train_seconds, start = sys.argv[1:]
steps = [line.rstrip("\n").split("\t") for line in open(os.path.join(work, "steps.tsv"))]
jobs = {}
for line in open(os.path.join(work, "jobs.tsv")):
    job, name, state, restarts = line.rstrip("\n").split("\t")
    jobs[name] = {"job": int(job), "state": state, "restarts": int(restarts or 0)}
results = {}
for root, _, files in os.walk(os.path.join(work, "checkpoints")):
    if "results.json" in files:
        r = json.load(open(os.path.join(root, "results.json")))
        results[r.get("row")] = r
summary = {"work_dir": work, "slurm": slurm, "cpu": f"{cpu}, {cores} cores", "load_average_at_end": os.getloadavg(),
           "train_seconds": int(train_seconds), "jobs": jobs,
           "steps_seconds": {name: round(float(s), 1) for name, s in steps},
           "total_seconds": round(time.time() - float(start), 1),
           "cpu_seconds": {"commands": round(float(commands_cpu), 1), "machine_busy": float(machine_cpu)},
           "resume": json.load(open(os.path.join(work, "resume.json"))),
           "results": results, "translation": json.load(open(os.path.join(work, "translation.json"))),
           "table": open(os.path.join(work, "results.md")).read()}
json.dump(summary, open(os.path.join(work, "rehearsal.json"), "w"), indent=1)
print(json.dumps({k: summary[k] for k in ("slurm", "cpu", "jobs", "steps_seconds", "total_seconds", "cpu_seconds",
                                          "translation")}, indent=1))
EOF
echo "rehearse-wmt: passed on $SLURM_VERSION; $WORK/rehearsal.json, table $WORK/results.md"
