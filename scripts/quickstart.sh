#!/usr/bin/env bash
# The main job on the bundled toy corpus, from a fresh machine:
#   set up .venv -> toy corpus + gold CoNLL-U + BPE -> fairseq-preprocess -> umst-preprocess
#   -> fairseq-train (a small model, 800 updates: about 3 minutes on 2 CPU cores; progress on the terminal)
#   -> fairseq-generate --scoring sacrebleu (BLEU line + a few test translations)
#   -> umst-inspect picture of one test sentence (when umst_plugin.inspect is installed).
# Full logs go to $WORK/*.log; TensorBoard event files to $WORK/tensorboard/$ARCH.
# Environment overrides: ARCH (default umst_base), MAX_UPDATE (default 800), WORK (default ./demo),
# EXTRA_TRAIN_ARGS, VENV (default ./.venv), SKIP_SETUP=1 (use the current environment as is),
# OMP_NUM_THREADS (default 1).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VENV="${VENV:-$ROOT/.venv}"
if [ -n "${SKIP_SETUP:-}" ]; then
  echo "[setup] SKIP_SETUP is set: using $VENV as it is"
else
  bash "$ROOT/scripts/setup_env.sh"
fi
export PATH="$VENV/bin:$PATH"
# One intra-op thread: the demo model's matrices are tiny, and on a busy 2-core machine two OpenMP
# threads spin-wait on each other (40 updates: 10 s with 1 thread, 185 s with 2, load average 8).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
WORK="${WORK:-$ROOT/demo}"
ARCH="${ARCH:-umst_base}"
MAX_UPDATE="${MAX_UPDATE:-800}"
SRC=kel; TGT=mor
N_SHOW=5  # test sentences shown at the end
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
cd "$WORK"
START=$SECONDS

if [ ! -f raw/test.$SRC ]; then
  echo "== toy corpus (Kelan -> Moru, gold dependency trees, joint BPE) -> $WORK/raw"
  python -m umst_plugin.toy raw
fi
if [ ! -f data-bin/test.$SRC-$TGT.$SRC.wordids.idx ]; then
  echo "== fairseq-preprocess -> $WORK/data-bin (log: preprocess.log)"
  fairseq-preprocess --source-lang $SRC --target-lang $TGT --trainpref raw/train --validpref raw/valid \
    --testpref raw/test --destdir data-bin --joined-dictionary --workers 2 > preprocess.log 2>&1 \
    || { tail -n 30 preprocess.log; exit 1; }
  echo "== umst-preprocess (word ids + dependency heads from the CoNLL-U parses)"
  python -m umst_plugin.preprocess --source-lang $SRC --target-lang $TGT --trainpref raw/train \
    --validpref raw/valid --testpref raw/test --destdir data-bin --parser conllu
fi

CKPT="checkpoints/$ARCH"
TB="tensorboard/$ARCH"
case "$ARCH" in
  transformer) ARCH_ARGS=(--encoder-normalize-before --decoder-normalize-before) ;;
  *) ARCH_ARGS=() ;;
esac
echo "== fairseq-train --arch $ARCH ($MAX_UPDATE updates, small dims for CPU; full log: train-$ARCH.log)"
TRAIN_START=$SECONDS
fairseq-train data-bin --user-dir "$ROOT/umst_plugin" --task multiscale_translation --arch "$ARCH" "${ARCH_ARGS[@]}" \
  --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 64 --decoder-embed-dim 64 \
  --encoder-ffn-embed-dim 128 --decoder-ffn-embed-dim 128 --encoder-attention-heads 4 --decoder-attention-heads 4 \
  --share-all-embeddings --dropout 0.1 --optimizer adam --adam-betas '(0.9,0.98)' --lr 3e-3 \
  --lr-scheduler inverse_sqrt --warmup-updates 200 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --max-tokens 2048 --max-update "$MAX_UPDATE" --save-dir "$CKPT" --no-epoch-checkpoints --keep-last-epochs 1 \
  --validate-interval 4 --save-interval 4 \
  --log-format simple --log-interval 20 --tensorboard-logdir "$TB" --num-workers 0 --seed 1 \
  ${EXTRA_TRAIN_ARGS:-} 2>&1 | python "$ROOT/scripts/train_progress.py" --log "train-$ARCH.log" --max-update "$MAX_UPDATE" \
  || { echo "fairseq-train failed; the end of train-$ARCH.log:"; tail -n 30 "train-$ARCH.log"; exit 1; }
TRAIN_SECONDS=$((SECONDS - TRAIN_START))

echo "== fairseq-generate on the test set (beam 4, sacrebleu; full log: generate-$ARCH.log)"
fairseq-generate data-bin --user-dir "$ROOT/umst_plugin" --task multiscale_translation --path "$CKPT/checkpoint_best.pt" \
  --gen-subset test --beam 4 --batch-size 128 --remove-bpe --scoring sacrebleu > "generate-$ARCH.log" 2>&1 \
  || { tail -n 30 "generate-$ARCH.log"; exit 1; }
grep -E "^Generate" "generate-$ARCH.log"

echo "== $N_SHOW test sentences (S source, T reference, H model; BPE removed)"
python - "generate-$ARCH.log" "$N_SHOW" <<'EOF'
import re, sys
rows = {}
with open(sys.argv[1], encoding="utf-8") as f:
    for line in f:
        m = re.match(r"^([STH])-(\d+)\t(.*)$", line.rstrip("\n"))
        if m:
            kind, i, rest = m.group(1), int(m.group(2)), m.group(3)
            rows.setdefault(i, {})[kind] = rest.split("\t")[-1]  # H-: score<TAB>text
for i in sorted(rows)[:int(sys.argv[2])]:
    r = rows[i]
    same = "  (= reference)" if r.get("H") == r.get("T") else ""
    print(f"  #{i:<4} S: {r.get('S', '')}\n        T: {r.get('T', '')}\n        H: {r.get('H', '')}{same}")
EOF

PICTURE=""
if python -c "import umst_plugin.inspect" 2>/dev/null; then
  PICTURE="$WORK/inspect-$ARCH-test0.png"
  echo "== umst-inspect: test sentence 0 -> $PICTURE"
  python -m umst_plugin.inspect data-bin --user-dir "$ROOT/umst_plugin" --subset test --index 0 --output "$PICTURE" \
    --path "$CKPT/checkpoint_best.pt" \
    > "inspect-$ARCH.log" 2>&1 || { tail -n 30 "inspect-$ARCH.log"; exit 1; }
fi

echo "== done: main job $((SECONDS - START)) s (training $TRAIN_SECONDS s)"
echo "  checkpoint:  $WORK/$CKPT/checkpoint_best.pt"
echo "  logs:        $WORK/train-$ARCH.log, $WORK/generate-$ARCH.log"
echo "  tensorboard: $WORK/$TB  (to view: pip install tensorboard; tensorboard --logdir $WORK/tensorboard)"
if [ -n "$PICTURE" ]; then
  echo "  picture:     $PICTURE"
fi
