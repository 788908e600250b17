#!/usr/bin/env bash
# Translate a test set and report BLEU as the WMT recipes do (docs/recipes.md, section 2).
#
#   bash scripts/evaluate.sh --data DATA_BIN --checkpoint CKPT [--row ROW] [--out DIR]
#        [--beam 4] [--lenpen 0.6] [--subset test[,SUBSET...]] [--max-tokens 8192] [--no-compound-split]
#        [--dry-run] [-- EXTRA_GENERATE_ARGS...]
#
# Runs fairseq-generate (beam 4, lenpen 0.6 unless --row or the flags say
# otherwise; --row ROW takes them from scripts/collect_results.py), then
# scripts/score.py: tokenized BLEU multi-bleu style (with compound splitting
# when the target is German, unless --no-compound-split) and detokenized sacreBLEU with its signature,
# against the references prepare-*.sh put in DATA_BIN/ref/. Writes
# OUT/generate-SUBSET.txt, OUT/hyp.detok.txt and OUT/results.json (read by
# collect_results.py). Default OUT: the checkpoint's directory. Several subsets (--subset test,test1,test2)
# are decoded by one process (umst_tools/generate_subsets.py: fairseq-generate's own code once per subset, one
# start-up); each gets its own OUT, so OUT must then contain {subset} (e.g. --out run/eval-{subset}).
# --dry-run: print the decoding settings and the fairseq-generate command, read and write nothing.
# Python: $PYTHON, else the active venv, else .venv.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/lib/env.sh"  # find_python: $PYTHON, the active venv, else .venv (no activation needed)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
DATA=""; CKPT=""; ROW=""; OUT=""; BEAM=""; LENPEN=""; SUBSET=test; MAX_TOKENS=8192; EXTRA=(); COMPOUND=1; DRY=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --data) DATA="$2"; shift 2 ;;
        --checkpoint) CKPT="$2"; shift 2 ;;
        --row) ROW="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --beam) BEAM="$2"; shift 2 ;;
        --lenpen) LENPEN="$2"; shift 2 ;;
        --subset) SUBSET="$2"; shift 2 ;;
        --max-tokens) MAX_TOKENS="$2"; shift 2 ;;
        --no-compound-split) COMPOUND=0; shift ;;
        --dry-run) DRY=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done
[[ -n "$DATA" && -n "$CKPT" ]] || { usage >&2; exit 2; }
find_python
[[ "$DRY" -eq 1 || -f "$CKPT" ]] || { echo "no checkpoint $CKPT" >&2; exit 2; }
OUT="${OUT:-$(dirname "$CKPT")}"
IFS=, read -r -a SUBSETS <<< "$SUBSET"
[[ ${#SUBSETS[@]} -ge 1 ]] || { echo "--subset: no subset given" >&2; exit 2; }
if [[ ${#SUBSETS[@]} -gt 1 && "$OUT" != *"{subset}"* ]]; then
    echo "--subset $SUBSET: several subsets need --out with {subset} in it (each gets its own results.json)" >&2
    exit 2
fi
out_of() { printf '%s' "${OUT//\{subset\}/$1}"; }
if [[ -n "$ROW" ]]; then
    info() { "$PY" "$ROOT/scripts/collect_results.py" --row-info "$ROW" "$1"; }
    BEAM="${BEAM:-$(info beam)}"; LENPEN="${LENPEN:-$(info lenpen)}"
fi
BEAM="${BEAM:-4}"; LENPEN="${LENPEN:-0.6}"

# Language pair from the binarized test set (SUBSET.SRC-TGT.SRC.bin), of every subset.
PAIR=""
for S in "${SUBSETS[@]}"; do
    P="$(cd "$DATA" 2>/dev/null && ls "$S".*-*.*.bin 2>/dev/null | head -1 | sed -E "s/^$S\.([^.]+)\..*/\1/")" || true
    [[ -n "$P" || "$DRY" -eq 1 ]] || { echo "no binarized $S set in $DATA" >&2; exit 2; }
    [[ -z "$PAIR" || -z "$P" || "$P" == "$PAIR" ]] || { echo "$DATA: $S is $P, not $PAIR" >&2; exit 2; }
    PAIR="${PAIR:-$P}"
done
PAIR="${PAIR:-SRC-TGT}"
SRC="${PAIR%-*}"; TGT="${PAIR#*-}"

MODEL=("$DATA" --user-dir "$ROOT/umst_plugin" --task multiscale_translation --source-lang "$SRC" --target-lang "$TGT"
    --path "$CKPT")
DECODING=(--beam "$BEAM" --lenpen "$LENPEN" --max-tokens "$MAX_TOKENS" --remove-bpe)
LAST=(--required-batch-size-multiple 1 ${EXTRA[@]+"${EXTRA[@]}"})  # EXTRA last: what the user adds wins
if [[ ${#SUBSETS[@]} -eq 1 ]]; then
    GENERATE=("$PY" -c 'from fairseq_cli.generate import cli_main; cli_main()' "${MODEL[@]}" --gen-subset "$SUBSET"
        "${DECODING[@]}" --results-path "$(out_of "$SUBSET")" "${LAST[@]}")
else
    GENERATE=("$PY" -m umst_tools.generate_subsets)
    for S in "${SUBSETS[@]}"; do GENERATE+=("$S=$(out_of "$S")"); done
    GENERATE+=(-- "${MODEL[@]}" "${DECODING[@]}" "${LAST[@]}")
fi
if [[ "$DRY" -eq 1 ]]; then
    echo "[evaluate.sh] beam $BEAM, lenpen $LENPEN, $SRC -> $TGT, subsets ${SUBSETS[*]}, results in $OUT" >&2
    printf '%q ' "${GENERATE[@]}"; echo
    exit 0
fi
for S in "${SUBSETS[@]}"; do mkdir -p "$(out_of "$S")"; rm -f "$(out_of "$S")/results.json"; done
"${GENERATE[@]}"
# --results-path writes OUT/generate-SUBSET.txt. --required-batch-size-multiple 1: fairseq-fixed
# 0.12.3.1's batch_by_size drops a final batch smaller than the multiple (default 8), i.e. up to 7
# test sentences would silently go untranslated.

for S in "${SUBSETS[@]}"; do
    O="$(out_of "$S")"
    SCORE=(--generate "$O/generate-$S.txt" --lang "$TGT" --json "$O/results.json" --detok-out "$O/hyp.detok.txt")
    [[ -f "$DATA/ref/$S.tok.$TGT" ]] && SCORE+=(--tok-ref "$DATA/ref/$S.tok.$TGT")
    [[ -f "$DATA/ref/$S.detok.$TGT" ]] && SCORE+=(--detok-ref "$DATA/ref/$S.detok.$TGT")
    [[ "$TGT" == de && "$COMPOUND" == 1 ]] && SCORE+=(--compound-split)
    [[ -f "$DATA/ref/$S.set" ]] && SCORE+=(--test-set "$(cat "$DATA/ref/$S.set")")  # (the WMT recipes write it)
    "$PY" "$ROOT/scripts/score.py" "${SCORE[@]}" \
        --extra "row=${ROW:-$(basename "$O")}" --extra "checkpoint=$(cd "$(dirname "$CKPT")" && pwd)/$(basename "$CKPT")" \
        --extra "checkpoint_name=$(basename "$CKPT")" --extra "data=$DATA" --extra "data_name=$(basename "$DATA")" \
        --extra "subset=$S" --extra "beam=$BEAM" --extra "lenpen=$LENPEN"
    echo "results: $O/results.json"
done
