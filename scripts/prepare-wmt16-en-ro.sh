#!/usr/bin/env bash
# WMT16 English-Romanian as in UMST table 3 and TranSFormer table 3 (the Lee et
# al. 2018 / Kasai et al. 2020 setup): Europarl v8 + SETimes2 for training,
# newsdev2016 for validation, newstest2016 for test; Moses punctuation
# normalisation, Romanian normalisation and diacritic removal (Sennrich's
# wmt16-scripts), Moses tokenization, clean-corpus-n, joint subword-nmt BPE
# (40K merges, a ~40K joined vocabulary), binarize, dependency side data.
#
#   bash scripts/prepare-wmt16-en-ro.sh
#   bash scripts/prepare-wmt16-en-ro.sh --raw-dir /data/wmt16-enro
#
# Output: WORK/data-bin/wmt16_en_ro_bpe40000 (+ ref/, bpe.codes). The detokenized
# reference keeps the normalisation (no diacritics), like the training targets.
set -euo pipefail
NAME=wmt16_en_ro; NAME_DL=wmt16-en-ro; SRC=en; TGT=ro
DEFAULT_WORK=data/wmt16_en_ro; DEFAULT_MERGES=40000
source "$(dirname "${BASH_SOURCE[0]}")/prepare-common.sh"
usage() { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; usage_common; }

TRAIN_CORPORA=(training-parallel-ep-v8/europarl-v8.ro-en SETIMES.en-ro)
VALID_SGM=(dev/newsdev2016-enro-src.en.sgm dev/newsdev2016-enro-ref.ro.sgm)
TEST_SGM=(test/newstest2016-enro-src.en.sgm test/newstest2016-enro-ref.ro.sgm)
# What the BLEU of the test split is on (DATA_BIN/ref/test.set; evaluate.sh puts it in results.json)
TEST_SET="newstest2016 (test/newstest2016-enro-ref.ro.sgm: 1,999 sentences; sacreBLEU's -t wmt16)"

# The detokenized reference keeps the training targets' normalisation (no diacritics).
reference_text() { "$PY" "$PREP" normalize-ro "$1" "$2"; }

parse_common_args "$@"
run_all_stages
