#!/usr/bin/env bash
# WMT14 English-German as in the papers (UMST, TranSFormer, MSC, Prime/MUSE):
# Europarl v7 + Common Crawl + News Commentary v9 for training, newstest2013 for
# validation, newstest2014 for test; Moses tokenization with aggressive hyphen
# splitting (fairseq's prepare-wmt14en2de.sh), clean-corpus-n (ratio 1.5,
# 1-250 tokens), joint subword-nmt BPE (32K merges; 7K and 15K for UMST figure 4),
# fairseq-preprocess with a joined dictionary, source dependency side data by
# umst-preprocess into the same data-bin. Prints the corpus statistics.
#
#   bash scripts/prepare-wmt14-en-de.sh                       # download + everything
#   bash scripts/prepare-wmt14-en-de.sh --raw-dir /data/wmt14  # files already there
#
# Output: WORK/data-bin/wmt14_en_de_bpe32000 (+ ref/ with the test references, bpe.codes).
set -euo pipefail
NAME=wmt14_en_de; NAME_DL=wmt14-en-de; SRC=en; TGT=de
DEFAULT_WORK=data/wmt14_en_de; DEFAULT_MERGES=32000
source "$(dirname "${BASH_SOURCE[0]}")/prepare-common.sh"
usage() { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; usage_common; }

# Extracted layout (what the archives of scripts/wmt-sources.txt unpack to).
TRAIN_CORPORA=(training/europarl-v7.de-en commoncrawl.de-en training/news-commentary-v9.de-en)
VALID_SGM=(test/newstest2013-src.en.sgm test/newstest2013-src.de.sgm)
TEST_SGM=(test-full/newstest2014-deen-src.en.sgm test-full/newstest2014-deen-ref.de.sgm)
# What the BLEU of the test split is on (DATA_BIN/ref/test.set; evaluate.sh puts it in results.json beside the
# sacreBLEU signature, which names no test set when scoring files): the full newstest2014, as fairseq's
# prepare-wmt14en2de.sh takes it.
TEST_SET="newstest2014, the full set (test-full/newstest2014-deen-ref.de.sgm: 3,003 sentences; sacreBLEU's -t wmt14/full, not its default -t wmt14, the 2,737 of them the WMT14 task kept)"

# The detokenized reference sacrebleu scores against: the untouched test/valid target.
reference_text() { cp "$1" "$2"; }

parse_common_args "$@"
run_all_stages
