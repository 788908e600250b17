#!/usr/bin/env bash
# The main job on the bundled toy corpus, from a fresh machine:
#   set up .venv -> toy corpus + gold CoNLL-U + BPE -> fairseq-preprocess -> umst-preprocess
#   -> fairseq-train (a small model, a few minutes on CPU) -> fairseq-generate --scoring sacrebleu -> BLEU line.
# Environment overrides: ARCH (default umst_base), MAX_UPDATE, WORK (default ./demo), EXTRA_TRAIN_ARGS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
VENV="${VENV:-$ROOT/.venv}"
export PATH="$VENV/bin:$PATH"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
WORK="${WORK:-$ROOT/demo}"
ARCH="${ARCH:-umst_base}"
MAX_UPDATE="${MAX_UPDATE:-2000}"
SRC=kel; TGT=mor
mkdir -p "$WORK"
cd "$WORK"

if [ ! -f raw/test.$SRC ]; then
  echo "== toy corpus (Kelan -> Moru, gold dependency trees, joint BPE)"
  python -m umst_plugin.toy raw
fi
if [ ! -f data-bin/test.$SRC-$TGT.$SRC.wordids.idx ]; then
  echo "== fairseq-preprocess"
  fairseq-preprocess --source-lang $SRC --target-lang $TGT --trainpref raw/train --validpref raw/valid \
    --testpref raw/test --destdir data-bin --joined-dictionary --workers 2 > preprocess.log 2>&1
  echo "== umst-preprocess (word ids + dependency heads from the CoNLL-U parses)"
  python -m umst_plugin.preprocess --source-lang $SRC --target-lang $TGT --trainpref raw/train \
    --validpref raw/valid --testpref raw/test --destdir data-bin --parser conllu
fi

CKPT="checkpoints/$ARCH"
case "$ARCH" in
  transformer) ARCH_ARGS=(--encoder-normalize-before --decoder-normalize-before) ;;
  *) ARCH_ARGS=() ;;
esac
echo "== fairseq-train --arch $ARCH ($MAX_UPDATE updates, small dims for CPU; log: $WORK/train-$ARCH.log)"
fairseq-train data-bin --user-dir "$ROOT/umst_plugin" --task multiscale_translation --arch "$ARCH" "${ARCH_ARGS[@]}" \
  --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 64 --decoder-embed-dim 64 \
  --encoder-ffn-embed-dim 128 --decoder-ffn-embed-dim 128 --encoder-attention-heads 4 --decoder-attention-heads 4 \
  --share-all-embeddings --dropout 0.1 --optimizer adam --adam-betas '(0.9,0.98)' --lr 3e-3 \
  --lr-scheduler inverse_sqrt --warmup-updates 200 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --max-tokens 2048 --max-update "$MAX_UPDATE" --save-dir "$CKPT" --no-epoch-checkpoints --keep-last-epochs 1 \
  --log-format simple --log-interval 100 --num-workers 0 --seed 1 ${EXTRA_TRAIN_ARGS:-} > "train-$ARCH.log" 2>&1 \
  || { tail -n 30 "train-$ARCH.log"; exit 1; }
grep -E "valid on|done training" "train-$ARCH.log" | tail -n 2

echo "== fairseq-generate (beam 4, sacrebleu)"
fairseq-generate data-bin --user-dir "$ROOT/umst_plugin" --task multiscale_translation --path "$CKPT/checkpoint_best.pt" \
  --gen-subset test --beam 4 --batch-size 128 --remove-bpe --scoring sacrebleu > "generate-$ARCH.log" 2>&1 \
  || { tail -n 30 "generate-$ARCH.log"; exit 1; }
grep -E "^Generate" "generate-$ARCH.log"
