#!/usr/bin/env bash
# Rehearse the WMT14 En-De recipe on this machine, as a cluster user runs it, before spending cluster hours:
# the user's own commands from docs/wmt-on-gpus.md, through Slurm (a local stand-in: umst_tools/slurm_shim), on a
# stand-in corpus (a few thousand Multi30k pairs in the WMT14 download's layout), at tiny width on CPUs.
#
#   bash scripts/rehearse-wmt.sh [--work-dir DIR] [--multi30k DIR] [--updates N]
#
# It starts from `env -i` (nothing active: no venv, no PYTHON, no PYTHONPATH), with the shim's sbatch, srun,
# scontrol, squeue and scancel first on PATH, and runs:
#   1. prepare-wmt14-en-de.sh --parse-shards 2; the parse as a Slurm array (scripts/slurm/parse-array.sbatch);
#      prepare again, which merges the shards;
#   2. umst-t2-umst-base on 2 nodes (train-2nodes.sbatch), the transformer baseline umst-t2-transformer-base on 2
#      nodes, and umst-t2-umst-base on 1 node (train-1node.sbatch) as the uninterrupted reference;
#   3. once the 2-node UMST run is at update N/2 (in its second epoch, where a real run's preemptions mostly come),
#      its time limit is shortened (scontrol update, as an administrator can) so that Slurm's warning
#      (--signal=B:USR1@180 of the sbatch script) comes mid-epoch: training saves checkpoint_last.pt and the job
#      requeues itself; the requeued run resumes from it;
#   4. the resumed run's losses against the reference's, every update (umst_tools.rehearsal compare; the
#      reference is one process with the same batch as the 2 nodes' two, so this is also the check that 2 nodes
#      train as 1);
#   5. umst-average-checkpoints, evaluate.sh (compound-split tokenized BLEU, sacreBLEU), collect_results.py;
#   6. one raw sentence translated from Python with umst_plugin.from_pretrained, no parser argument.
# Any step that fails stops the rehearsal with its log named. Output: WORK/rehearsal.json (what each step
# measured and how long it took), WORK/logs/ (every job's log), WORK/results.md (the table).
# Defaults: --work-dir a new directory under ${TMPDIR:-/tmp}; --multi30k ../shared/data/multi30k (Multi30k's raw
# *.gz files: scripts/prepare-multi30k.sh downloads them into data/multi30k/raw); --updates 72 (an epoch is 31: the
# stop comes in the second, and the signal's way through the stand-in Slurm leaves it room on a fast machine).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() { sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

WORK=""; MULTI30K=""; UPDATES=72
while [[ $# -gt 0 ]]; do
    case "$1" in
        --work-dir) WORK="$2"; shift 2 ;;
        --multi30k) MULTI30K="$2"; shift 2 ;;
        --updates) UPDATES="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "rehearse-wmt: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done
if [[ -z "${UMST_REHEARSAL_BARE:-}" ]]; then
    WORK="${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/umst-rehearsal.XXXXXX")}"
    mkdir -p "$WORK"; WORK="$(cd "$WORK" && pwd)"
    if [[ -z "$MULTI30K" ]]; then
        for d in "$ROOT/../shared/data/multi30k" "$ROOT/data/multi30k/raw"; do [[ -f "$d/train.en.gz" ]] && MULTI30K="$d" && break; done
    fi
    [[ -n "$MULTI30K" && -f "$MULTI30K/train.en.gz" ]] || {
        echo "rehearse-wmt: no Multi30k raw files (train.en.gz ...); give --multi30k DIR (bash scripts/prepare-multi30k.sh downloads them)" >&2
        exit 2; }
    MULTI30K="$(cd "$MULTI30K" && pwd)"
    # a login shell's environment and nothing else; the Slurm commands are the shim's
    exec env -i HOME="${HOME:-/root}" USER="${USER:-$(id -un)}" LANG=C.UTF-8 TMPDIR="${TMPDIR:-/tmp}" \
        PATH="$ROOT/umst_tools/slurm_shim/bin:/usr/local/bin:/usr/bin:/bin" SLURM_SHIM_STATE="$WORK/slurm" \
        UMST_REHEARSAL_BARE=1 bash "${BASH_SOURCE[0]}" --work-dir "$WORK" --multi30k "$MULTI30K" --updates "$UPDATES"
fi

LOGS="$WORK/logs"; CK="$WORK/checkpoints"; RECORD="$WORK/steps.tsv"
mkdir -p "$LOGS" "$CK"; : > "$RECORD"
T0=$(date +%s.%N)
step() {  # step NAME: the time since the previous one goes to steps.tsv
    local now; now=$(date +%s.%N)
    awk -v name="$1" -v a="$T0" -v b="$now" 'BEGIN { printf "%s\t%.1f\n", name, b - a }' >> "$RECORD"; T0="$now"
    echo "== rehearse-wmt: $1 done"
}
fail() { echo "rehearse-wmt: FAILED: $*" >&2; exit 1; }
# a rehearsal that stops early cancels what it submitted (its jobs run detached, as on a cluster)
cancel_jobs() { local ids; ids="$(squeue -h -o %A 2>/dev/null | sort -u)"; [[ -z "$ids" ]] || scancel $ids || true; }
trap cancel_jobs EXIT
job_field() { scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
wait_jobs() {  # until none of the jobs is pending or running
    while [[ -n "$(squeue -h -j "$(IFS=,; echo "$*")" -t PD,R)" ]]; do sleep 0.5; done
}
cd "$ROOT"  # the user submits from the repository root (the jobs read $SLURM_SUBMIT_DIR)
export OMP_NUM_THREADS=1  # one thread per process: the 2 "nodes" and the reference share this machine's cores
export GPUS_PER_NODE=0    # the shim's nodes are CPUs (launch.sh's train.sh --gpus 0: fp32 over gloo)

# ---- 1. data: the stand-in download, prepare, the parse as a Slurm array, prepare again (merge) ----------------
python3 -m umst_tools.rehearsal standin --multi30k "$MULTI30K" --raw-dir "$WORK/raw" --train 2000 --valid 40 --test 40
PREP=(--raw-dir "$WORK/raw" --work-dir "$WORK/data" --bpe-merges 1000 --parser spacy
      --parser-args "--chunk-size 1000" --parse-shards 2 --workers 2)
bash scripts/prepare-wmt14-en-de.sh "${PREP[@]}" > "$LOGS/prepare-1.log" 2>&1 || fail "prepare (see $LOGS/prepare-1.log)"
step prepare
sbatch --wait --array=1-2 --output="$LOGS/%x-%A_%a.out" scripts/slurm/parse-array.sbatch wmt14-en-de "${PREP[@]}" \
    || fail "the parse array (see $LOGS/umst-parse-*.out)"
step parse-array
bash scripts/prepare-wmt14-en-de.sh "${PREP[@]}" > "$LOGS/prepare-2.log" 2>&1 || fail "prepare after the parse (see $LOGS/prepare-2.log)"
grep -q "merging the 2 parse shards" "$LOGS/prepare-2.log" || fail "the second prepare did not merge the shards ($LOGS/prepare-2.log)"
D="$WORK/data/data-bin/wmt14_en_de_bpe1000"
[[ -f "$D/train.en-de.en.heads.bin" || -n "$(ls "$D"/train.en-de.en.*heads* 2>/dev/null)" ]] || fail "no dependency side data in $D"
step merge

# ---- 2. train: tiny width, no dropout (the 2-node run and the 1-node reference compute the same function) ------
TINY=(+model.encoder_layers=1 +model.decoder_layers=1 +model.encoder_embed_dim=32 +model.decoder_embed_dim=32
      +model.encoder_ffn_embed_dim=64 +model.decoder_ffn_embed_dim=64 +model.encoder_attention_heads=2
      +model.decoder_attention_heads=2 model.dropout=0.0 model.attention_dropout=0.0 model.activation_dropout=0.0
      dataset.max_tokens=1024 "optimization.update_freq=[2]" lr_scheduler.warmup_updates=10 common.log_interval=1
      dataset.num_workers=0 dataset.disable_validation=true checkpoint.save_interval_updates=10
      checkpoint.keep_interval_updates=5)
SUBMIT=(sbatch --parsable --gres=none --output="$LOGS/%x-%j.out")
UMST=$("${SUBMIT[@]}" --job-name=umst-2nodes scripts/slurm/train-2nodes.sbatch umst-t2-umst-base "$D" \
       --save-dir "$CK/umst-2nodes" --precision fp32 -- "${TINY[@]}" optimization.max_update="$UPDATES")
REFERENCE=$("${SUBMIT[@]}" --job-name=umst-reference scripts/slurm/train-1node.sbatch umst-t2-umst-base "$D" \
            --save-dir "$CK/umst-reference" --precision fp32 -- "${TINY[@]}" optimization.max_update="$UPDATES")
BASELINE=$("${SUBMIT[@]}" --job-name=transformer-2nodes scripts/slurm/train-2nodes.sbatch umst-t2-transformer-base "$D" --save-dir "$CK/transformer-2nodes" \
           --precision fp32 -- "${TINY[@]}" optimization.max_update=20)
UMST_LOG="$LOGS/umst-2nodes-$UMST.out"

# ---- 3. the time limit, mid-epoch: Slurm's warning 180 s before it comes now --------------------------------------
STOP_AT=$(( UPDATES / 2 ))
python3 -m umst_tools.rehearsal wait-for-update "$UMST_LOG" "$STOP_AT" --timeout 300 >/dev/null \
    || fail "the 2-node run did not reach update $STOP_AT ($UMST_LOG)"
RUN=$(job_field "$UMST" RunTime); IFS=: read -r h m s <<< "$RUN"
# RunTime is whole seconds, at most the time run: with the signal lead time of train-2nodes.sbatch (180 s) added,
# the warning is due now
LIMIT=$(( 10#$h * 3600 + 10#$m * 60 + 10#$s + 180 ))
scontrol update JobId="$UMST" TimeLimit="$(( LIMIT / 60 )):$(printf %02d $(( LIMIT % 60 )))"
for _ in $(seq 600); do [[ "$(job_field "$UMST" Restarts)" -ge 1 ]] && break; sleep 0.2; done
[[ "$(job_field "$UMST" Restarts)" -ge 1 ]] || fail "job $UMST was not requeued ($UMST_LOG)"
scontrol update JobId="$UMST" TimeLimit=30:00  # the requeued run gets its time back (an administrator's update)
step "time-limit-and-requeue"
wait_jobs "$UMST" "$REFERENCE" "$BASELINE"
for j in "$UMST" "$REFERENCE" "$BASELINE"; do
    [[ "$(job_field "$j" JobState)" == COMPLETED ]] || fail "job $j ended $(job_field "$j" JobState) ($LOGS/*-$j.out)"
done
step train

# ---- 4. resumed against uninterrupted --------------------------------------------------------------------------
.venv/bin/python -m umst_tools.rehearsal compare --preempted "$CK/umst-2nodes" --log "$UMST_LOG" \
    --reference "$CK/umst-reference" --reference-log "$LOGS/umst-reference-$REFERENCE.out" --tolerance 1e-4 \
    --json "$WORK/resume.json" > "$LOGS/compare.log" || fail "the resumed run differs from the reference ($WORK/resume.json)"
step compare

# ---- 5. average, evaluate, collect (docs/recipes.md, section 2) -----------------------------------------------------
average_and_evaluate() {  # ROW SAVE_DIR: the two rows side by side, as from two shells
    .venv/bin/umst-average-checkpoints --inputs "$2" --num-update-checkpoints 2 --output "$2/checkpoint_avg2.pt" \
        > "$LOGS/average-$1.log" 2>&1 || { echo "averaging $2 failed ($LOGS/average-$1.log)" >&2; return 1; }
    bash scripts/evaluate.sh --data "$D" --checkpoint "$2/checkpoint_avg2.pt" --row "$1" --max-tokens 4096 \
        > "$LOGS/evaluate-$1.log" 2>&1 || { echo "evaluate.sh $1 failed ($LOGS/evaluate-$1.log)" >&2; return 1; }
}
average_and_evaluate umst-t2-umst-base "$CK/umst-2nodes" & A=$!
average_and_evaluate umst-t2-transformer-base "$CK/transformer-2nodes" & B=$!
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

# CPU time: this shell's commands (bash's `times`, its children's line) and every job's (TotalCPU, as sacct's)
times > "$WORK/times.txt"  # (not in a pipe: a subshell's `times` has no children)
COMMANDS_CPU=$(tail -n 1 "$WORK/times.txt" | awk '{ split($1, u, "m"); split($2, s, "m"); print u[1] * 60 + u[2] + s[1] * 60 + s[2] }')
JOBS_CPU=$(scontrol show job | tr ' ' '\n' | sed -n 's/^TotalCPU=//p' | awk '{ t += $1 } END { print t + 0 }')
python3 - "$WORK" "$UMST" "$REFERENCE" "$BASELINE" "$COMMANDS_CPU" "$JOBS_CPU" <<'EOF'
import json, os, sys
work, umst, reference, baseline, commands_cpu, jobs_cpu = sys.argv[1:]
steps = [line.rstrip("\n").split("\t") for line in open(os.path.join(work, "steps.tsv"))]
results = {}
for root, _, files in os.walk(os.path.join(work, "checkpoints")):
    if "results.json" in files:
        r = json.load(open(os.path.join(root, "results.json")))
        results[r.get("row")] = r
summary = {"work_dir": work, "jobs": {"umst_2nodes": int(umst), "umst_reference": int(reference),
                                      "transformer_2nodes": int(baseline)},
           "steps_seconds": {name: round(float(s), 1) for name, s in steps},
           "total_seconds": round(sum(float(s) for _, s in steps), 1),
           "cpu_seconds": {"commands": round(float(commands_cpu), 1), "jobs": round(float(jobs_cpu), 1),
                           "total": round(float(commands_cpu) + float(jobs_cpu), 1)},
           "resume": json.load(open(os.path.join(work, "resume.json"))),
           "results": results, "translation": json.load(open(os.path.join(work, "translation.json"))),
           "table": open(os.path.join(work, "results.md")).read()}
json.dump(summary, open(os.path.join(work, "rehearsal.json"), "w"), indent=1)
print(json.dumps({k: summary[k] for k in ("steps_seconds", "total_seconds", "cpu_seconds", "translation")}, indent=1))
EOF
echo "rehearse-wmt: passed; $WORK/rehearsal.json, table $WORK/results.md"
