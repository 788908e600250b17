#!/usr/bin/env bash
# Multi30k En-De (task 1: 29,000 English image captions with German translations), the
# real-language recipe of docs/multi30k.md: sha256-verified raw files, Moses punctuation
# normalisation and tokenization (lowercased by default, as the dataset's own tok/ files and the
# published Transformer-tiny reference of 41.02 tokenized BLEU), joint subword-nmt BPE (10,000
# merges: a ~10K joined vocabulary for a 29K-sentence corpus), the dependency parse of the
# English source, fairseq-preprocess (joined dictionary), umst-preprocess.
#
#   bash scripts/prepare-multi30k.sh --raw-dir ../shared/data/multi30k --parser spacy \
#        --parser-args "--parser-model en_core_web_md"
#   bash scripts/prepare-multi30k.sh            # downloads the pinned files (stanza parser)
#
# Splits: train, valid = val, test = test_2016_flickr, test1 = test_2017_flickr,
# test2 = test_2017_mscoco. Output: WORK/data-bin/multi30k_en_de_bpeN (+ ref/, bpe.codes,
# preprocessing.json: the record that makes raw input at inference lowercased too);
# with --cased, data/multi30k_en_de_cased/.../multi30k_en_de_cased_bpeN.
set -euo pipefail
SRC=en; TGT=de
CASE=lower
ARGS=()
for a in "$@"; do
    if [[ "$a" == --cased ]]; then CASE=cased; else ARGS+=("$a"); fi
done
if [[ "$CASE" == cased ]]; then NAME=multi30k_en_de_cased; TOKENIZE_ARGS=(--no-aggressive-dashes)
else NAME=multi30k_en_de; TOKENIZE_ARGS=(--lowercase --no-aggressive-dashes); fi
DEFAULT_WORK=data/$NAME; DEFAULT_MERGES=10000
TEST_SPLITS=(test test1 test2)
# Captions are short and parallel by construction: keep every non-empty pair (no length-ratio
# filter, unlike the WMT recipes), so the training set is the published 29,000 pairs.
CLEAN_RATIO=1000
source "$(dirname "${BASH_SOURCE[0]}")/prepare-common.sh"
SOURCES="${MULTI30K_SOURCES:-$ROOT/scripts/multi30k-sources.txt}"
usage() {
    sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    usage_common | sed 's|  --raw-dir DIR .*|  --raw-dir DIR      a directory holding the ten gzipped raw files (skips the download; still verified)|'
    echo "  --cased            keep case (detokenized sacreBLEU on cased text); default: lowercased"
    echo "Environment: MULTI30K_SOURCES (file list with sha256; default scripts/multi30k-sources.txt)."
}

# FILE SHA256 SPLIT rows of the sources list
source_rows() { grep -v '^#' "$SOURCES" | grep -v '^url-prefix' | awk 'NF == 3'; }

# verify FILE SHA256: the whole archive, byte for byte, before anything is read from it.
verify() {
    local file="$1" want="$2" got bytes
    got="$(sha256sum "$file" | cut -d' ' -f1)"
    if [[ "$got" != "$want" ]]; then
        bytes="$(wc -c < "$file" | tr -d ' ')"
        echo "[$NAME] ERROR: $file: sha256 $got ($bytes bytes), expected $want (from $SOURCES): the file is" \
             "truncated, corrupted or not the pinned release; nothing was extracted from it" >&2
        return 1
    fi
    if ! gzip -t "$file" 2>/dev/null; then
        echo "[$NAME] ERROR: $file: not a valid gzip stream (gzip -t failed)" >&2; return 1
    fi
}

stage_download() {
    local file sum split bad=0
    if [[ -n "$RAW_DIR" ]]; then
        RAW_DIR="$(cd "$RAW_DIR" && pwd)"; say "download: skipped (--raw-dir $RAW_DIR)"
    else
        RAW_DIR="$WORK/raw"; mkdir -p "$RAW_DIR"
        local prefix; prefix="$(awk '$1 == "url-prefix" {print $2}' "$SOURCES")"
        while read -r file sum split; do
            [[ -f "$RAW_DIR/$file" ]] && continue
            say "download $prefix/$file"
            curl -fL --retry 3 -o "$RAW_DIR/$file.part" "$prefix/$file" \
                || { echo "[$NAME] ERROR: could not download $prefix/$file" >&2; rm -f "$RAW_DIR/$file.part"; exit 1; }
            if verify "$RAW_DIR/$file.part" "$sum"; then mv "$RAW_DIR/$file.part" "$RAW_DIR/$file"
            else mv "$RAW_DIR/$file.part" "$RAW_DIR/$file.rejected"; bad=1; fi
        done < <(source_rows)
        [[ "$bad" == 0 ]] || { echo "[$NAME] rejected downloads kept as *.rejected in $RAW_DIR" >&2; exit 1; }
    fi
}

# extract: every archive verified first, then decompressed to orig/SPLIT.LANG; nothing is written
# under its final name (and no stamp) unless all ten verify and each split's sides have equal lines.
stage_extract() {
    done_stage extract "$CASE" && { say "extract: done before"; return; }
    if [[ -f "$WORK/.stamps/extract" ]]; then
        echo "[$NAME] ERROR: $WORK was prepared with case '$(cat "$WORK/.stamps/extract")', not '$CASE';" \
             "use another --work-dir" >&2; exit 2
    fi
    local file sum split bad=0 lang n_src n_tgt
    while read -r file sum split; do
        if [[ ! -f "$RAW_DIR/$file" ]]; then
            echo "[$NAME] ERROR: missing $RAW_DIR/$file (expected the ten files of $SOURCES)" >&2; bad=1; continue
        fi
        verify "$RAW_DIR/$file" "$sum" || bad=1
    done < <(source_rows)
    [[ "$bad" == 0 ]] || exit 1
    mkdir -p "$WORK/orig" "$WORK/ref"
    while read -r file sum split; do
        lang="${file%.gz}"; lang="${lang##*.}"
        gzip -dc "$RAW_DIR/$file" > "$WORK/orig/$split.$lang.tmp"
    done < <(source_rows)
    for split in train valid "${TEST_SPLITS[@]}"; do
        n_src=$(wc -l < "$WORK/orig/$split.$SRC.tmp"); n_tgt=$(wc -l < "$WORK/orig/$split.$TGT.tmp")
        if [[ "$n_src" != "$n_tgt" ]]; then
            echo "[$NAME] ERROR: $split: $n_src $SRC lines but $n_tgt $TGT lines; the sides must align" >&2
            rm -f "$WORK"/orig/*.tmp; exit 1
        fi
    done
    for split in train valid "${TEST_SPLITS[@]}"; do
        for lang in "$SRC" "$TGT"; do mv "$WORK/orig/$split.$lang.tmp" "$WORK/orig/$split.$lang"; done
        # The detokenized reference sacreBLEU reads: the raw text, lowercased when the recipe is.
        if [[ "$CASE" == lower ]]; then "$PY" "$PREP" lowercase "$WORK/orig/$split.$TGT" "$WORK/ref/$split.$TGT"
        else cp "$WORK/orig/$split.$TGT" "$WORK/ref/$split.$TGT"; fi
    done
    mark_stage extract "$CASE"
}

# The UMST ablation "no phrase edges": the same data-bin (fairseq files linked, not copied) with side
# files from umst-preprocess --parser none (every word its own phrase): DATABIN_noparse.
stage_noparse_variant() {
    local dest="${DATABIN}_noparse" f
    if done_stage "noparse$MERGES"; then
        say "no-parse variant: done before"
        # its own record (the same text steps; source_parse: none), also for a variant made before records
        stage_record "$dest"
        return
    fi
    rm -rf "$dest" "$dest.tmp"; mkdir -p "$dest.tmp"
    for f in "$DATABIN"/*; do
        case "$(basename "$f")" in
            *.wordids*|*.heads*|*.labels*|preprocessing.json|source-parse.json) ;; *) ln -s "$f" "$dest.tmp/" ;;
        esac
    done
    say "no-parse variant (umst-preprocess --parser none): $dest"
    "$PY" -m umst_plugin.preprocess --source-lang "$SRC" --target-lang "$TGT" --trainpref "$BPE_DIR/train" \
        --validpref "$BPE_DIR/valid" --testpref "$(test_prefixes)" --destdir "$dest.tmp" \
        --text-dir "$BPE_DIR/side-noparse" --parser none --no-progress
    mv "$dest.tmp" "$dest"
    stage_record "$dest"  # the text steps of the main data-bin; source_parse: none (what this variant read)
    mark_stage "noparse$MERGES"
}

parse_common_args "${ARGS[@]+"${ARGS[@]}"}"
run_all_stages
stage_noparse_variant
