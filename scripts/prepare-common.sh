# Shared stages of prepare-wmt14-en-de.sh and prepare-wmt16-en-ro.sh (sourced, not run).
#
# Every stage writes its outputs, then a stamp in $WORK/.stamps; a stage whose
# stamp exists (with the same parameters) is skipped, so re-running after an
# interruption resumes where it stopped. Stage outputs that depend on a choice
# (BPE merges, parser) live in directories named after it.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# A recipe may set these before sourcing: the test sets (fairseq names test, test1, ...), extra
# arguments of every tokenize call (e.g. --lowercase) and CLEAN_RATIO (clean-corpus-n's -ratio, 1.5).
TEST_SPLITS=("${TEST_SPLITS[@]:-test}")
TOKENIZE_ARGS=("${TOKENIZE_ARGS[@]+"${TOKENIZE_ARGS[@]}"}")
# The project's environment (scripts/setup_env.sh) without activating it first: find_python (called once the
# arguments are read, so that --help needs no environment) sets PY.
source "$ROOT/scripts/lib/env.sh"
PREP="$ROOT/scripts/wmt_prep.py"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

usage_common() {
    cat <<EOF
Options:
  --raw-dir DIR      already downloaded and extracted archives (or a mirror); skips the download stage
  --work-dir DIR     where every stage writes (default: $DEFAULT_WORK)
  --bpe-merges N     joint subword-nmt BPE merges (default: $DEFAULT_MERGES)
  --parser NAME      source dependency parser for umst-preprocess: stanza | spacy | conllu | none
                     (default: stanza; conllu reads gold parses from --conllu-dir)
  --parser-args "A"  extra umst-preprocess arguments for the parser backend (e.g. its model name)
  --conllu-dir DIR   with --parser conllu: {train,valid,test}.$SRC.conllu, parses of the extracted
                     (uncleaned) source text in corpus order; cleaning filters them along
  --parse-shards N   the parse as N shards, each its own job (scripts/slurm/parse-array.sbatch, a Slurm array
                     of N tasks, or N processes): this command runs every stage up to the binarized text and
                     stops before the parse until all N shards are there; run it again afterwards and it merges
                     them (no parsing: checked line by line against the BPE text) and finishes. Shards found
                     from an earlier array are merged even without the flag. Same options on every run.
  --parse-shard I/N  parse only shard I of N (1-based) and exit: what each array task runs; needs the stages
                     up to the binarized text done (a run with --parse-shards N first)
  --workers N        parallel workers for tokenization, BPE and binarization (default: nproc)
  --dry-run          check the options and say what would run; run nothing, write nothing
  -h, --help         this help
Environment: PYTHON (interpreter with fairseq, sacremoses, subword-nmt; default: the active virtualenv,
             else .venv/bin/python of scripts/setup_env.sh; without either the script stops and says so).
EOF
}

parse_common_args() {
    COMMON_ARGS=("$@")
    RAW_DIR=""; WORK="$DEFAULT_WORK"; MERGES="$DEFAULT_MERGES"; PARSER="stanza"; PARSER_ARGS=""
    CONLLU_DIR=""; WORKERS="$(nproc 2>/dev/null || echo 4)"; PARSE_SHARDS=""; PARSE_SHARD=""; DRY_RUN=0
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --raw-dir) RAW_DIR="$2"; shift 2 ;;
            --work-dir) WORK="$2"; shift 2 ;;
            --bpe-merges) MERGES="$2"; shift 2 ;;
            --parser) PARSER="$2"; shift 2 ;;
            --parser-args) PARSER_ARGS="$2"; shift 2 ;;
            --conllu-dir) CONLLU_DIR="$2"; shift 2 ;;
            --workers) WORKERS="$2"; shift 2 ;;
            --parse-shards) PARSE_SHARDS="$2"; shift 2 ;;
            --parse-shard) PARSE_SHARD="$2"; shift 2 ;;
            --dry-run) DRY_RUN=1; shift ;;
            -h|--help) usage; exit 0 ;;
            *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
        esac
    done
    if [[ "$PARSER" == conllu && -z "$CONLLU_DIR" ]]; then
        echo "--parser conllu needs --conllu-dir" >&2; exit 2
    fi
    if [[ -n "$PARSE_SHARDS" ]] && ! [[ "$PARSE_SHARDS" =~ ^[1-9][0-9]*$ ]]; then
        echo "--parse-shards $PARSE_SHARDS: expected a number of shards >= 1" >&2; exit 2
    fi
    if [[ -n "$PARSE_SHARD" ]]; then
        if ! [[ "$PARSE_SHARD" =~ ^([0-9]+)/([0-9]+)$ ]] || (( BASH_REMATCH[1] < 1 || BASH_REMATCH[1] > BASH_REMATCH[2] )); then
            echo "--parse-shard $PARSE_SHARD: expected I/N with 1 <= I <= N, e.g. 3/16" >&2; exit 2
        fi
        [[ -z "$PARSE_SHARDS" || "$PARSE_SHARDS" == "${BASH_REMATCH[2]}" ]] || {
            echo "--parse-shard $PARSE_SHARD and --parse-shards $PARSE_SHARDS disagree on the number of shards" >&2; exit 2; }
    fi
    if [[ -n "$PARSE_SHARDS$PARSE_SHARD" && ( "$PARSER" == conllu || "$PARSER" == none ) ]]; then
        echo "--parser $PARSER reads no model: nothing to shard (drop --parse-shards / --parse-shard)" >&2; exit 2
    fi
    find_python
    if [[ "$DRY_RUN" -eq 1 ]]; then
        local what="every stage (download .. record)"
        [[ -n "$PARSE_SHARDS" ]] && what="every stage; the parse as $PARSE_SHARDS shards (stops before it until they are there)"
        [[ -n "$PARSE_SHARD" ]] && what="the parse of shard $PARSE_SHARD only"
        say "dry run: options accepted; would run $what in $WORK (BPE $MERGES merges, --parser $PARSER${PARSER_ARGS:+ $PARSER_ARGS}) with $PY"
        exit 0
    fi
    mkdir -p "$WORK/.stamps"
    WORK="$(cd "$WORK" && pwd)"
    BPE_DIR="$WORK/bpe$MERGES"
    DATABIN="$WORK/data-bin/${NAME}_bpe$MERGES"
}

# done_stage NAME [PARAMS]: true when the stage already ran with the same parameters.
done_stage() { [[ -f "$WORK/.stamps/$1" && "$(cat "$WORK/.stamps/$1")" == "${2:-done}" ]]; }
mark_stage() { echo "${2:-done}" > "$WORK/.stamps/$1"; }
say() { echo "[$NAME] $*" >&2; }

stage_download() {
    if [[ -n "$RAW_DIR" ]]; then
        RAW_DIR="$(cd "$RAW_DIR" && pwd)"; say "download: skipped (--raw-dir $RAW_DIR)"; return
    fi
    RAW_DIR="$WORK/raw"
    bash "$ROOT/scripts/download-wmt.sh" "$NAME_DL" "$RAW_DIR"
}

need_file() { [[ -f "$1" ]] || { echo "[$NAME] missing $1 (expected in --raw-dir; see scripts/wmt-sources.txt)" >&2; exit 1; }; }

# concat_corpora OUT_PREFIX LANG PREFIX...: concatenate PREFIX.LANG files
concat_corpora() {
    local out="$1" lang="$2"; shift 2
    local files=() p
    for p in "$@"; do need_file "$p.$lang"; files+=("$p.$lang"); done
    cat "${files[@]}" > "$out.$lang.tmp" && mv "$out.$lang.tmp" "$out.$lang"
}

# stage_extract: the training corpora (TRAIN_CORPORA: path prefixes in RAW_DIR, one file per
# language) concatenated, and the valid / test SGML (VALID_SGM, TEST_SGM: source, reference) as
# plain text; the calling script's reference_text IN OUT writes the reference sacrebleu reads.
stage_extract() {
    done_stage extract && { say "extract: done before"; return; }
    mkdir -p "$WORK/orig" "$WORK/ref"
    local lang p prefixes=()
    for p in "${TRAIN_CORPORA[@]}"; do prefixes+=("$RAW_DIR/$p"); done
    for lang in "$SRC" "$TGT"; do concat_corpora "$WORK/orig/train" "$lang" "${prefixes[@]}"; done
    for p in "${VALID_SGM[@]}" "${TEST_SGM[@]}"; do need_file "$RAW_DIR/$p"; done
    "$PY" "$PREP" sgm "$RAW_DIR/${VALID_SGM[0]}" "$WORK/orig/valid.$SRC"
    "$PY" "$PREP" sgm "$RAW_DIR/${VALID_SGM[1]}" "$WORK/orig/valid.$TGT"
    "$PY" "$PREP" sgm "$RAW_DIR/${TEST_SGM[0]}" "$WORK/orig/test.$SRC"
    "$PY" "$PREP" sgm "$RAW_DIR/${TEST_SGM[1]}" "$WORK/orig/test.$TGT"
    reference_text "$WORK/orig/test.$TGT" "$WORK/ref/test.$TGT"
    reference_text "$WORK/orig/valid.$TGT" "$WORK/ref/valid.$TGT"
    mark_stage extract
}

# romanian_lang LANG: true when LANG's text gets normalise-romanian + remove-diacritics (tokenize's --romanian)
romanian_lang() { [[ "$1" == ro ]]; }

stage_tokenize() {
    done_stage tokenize && { say "tokenize: done before"; return; }
    mkdir -p "$WORK/tok"
    local split lang extra
    for split in train valid "${TEST_SPLITS[@]}"; do
        for lang in "$SRC" "$TGT"; do
            extra=("${TOKENIZE_ARGS[@]}"); romanian_lang "$lang" && extra+=(--romanian)
            say "tokenize $split.$lang"
            "$PY" "$PREP" tokenize --lang "$lang" "${extra[@]}" --workers "$WORKERS" \
                "$WORK/orig/$split.$lang" "$WORK/tok/$split.$lang"
        done
    done
    mark_stage tokenize
}

stage_clean() {
    done_stage clean && { say "clean: done before"; return; }
    "$PY" "$PREP" clean --ratio "${CLEAN_RATIO:-1.5}" --min 1 --max 250 --keep-file "$WORK/tok/train.clean.keep" \
        "$WORK/tok/train" "$SRC" "$TGT" "$WORK/tok/train.clean"
    mark_stage clean
}

stage_bpe() {
    done_stage "bpe$MERGES" && { say "bpe ($MERGES merges): done before"; return; }
    mkdir -p "$BPE_DIR"
    say "learn joint BPE, $MERGES merges"
    cat "$WORK/tok/train.clean.$SRC" "$WORK/tok/train.clean.$TGT" \
        | "$PY" -m subword_nmt.learn_bpe -s "$MERGES" > "$BPE_DIR/codes.tmp"
    mv "$BPE_DIR/codes.tmp" "$BPE_DIR/codes"
    local split lang input
    for split in train valid "${TEST_SPLITS[@]}"; do
        input="$WORK/tok/$split"; [[ "$split" == train ]] && input="$WORK/tok/train.clean"
        for lang in "$SRC" "$TGT"; do
            "$PY" -m subword_nmt.apply_bpe -c "$BPE_DIR/codes" --num-workers "$WORKERS" \
                < "$input.$lang" > "$BPE_DIR/$split.$lang.tmp"
            mv "$BPE_DIR/$split.$lang.tmp" "$BPE_DIR/$split.$lang"
        done
    done
    mark_stage "bpe$MERGES"
}

# Binarize and parse run in one Python process (importing fairseq once; it takes seconds), each
# still its own stage with its own stamp.
# test_prefixes: the BPE prefixes of the test sets, comma-separated (fairseq's --testpref)
test_prefixes() {
    local split prefixes=""
    for split in "${TEST_SPLITS[@]}"; do prefixes+="${prefixes:+,}$BPE_DIR/$split"; done
    echo "$prefixes"
}

# The umst-preprocess arguments of the parse stage (PARSE_ARGV), without --shard / --merge-shards.
parse_argv() {
    PARSE_ARGV=(--source-lang "$SRC" --target-lang "$TGT" --trainpref "$BPE_DIR/train"
                --validpref "$BPE_DIR/valid" --testpref "$(test_prefixes)" --destdir "$DATABIN"
                --text-dir "$BPE_DIR/side" --parser "$PARSER")
    # shellcheck disable=SC2206  # word splitting of the user's extra arguments is intended
    [[ -n "$PARSER_ARGS" ]] && PARSE_ARGV+=($PARSER_ARGS)
    return 0
}

# The parse as shards: shard I of N writes BPE_DIR/side/{split}.SRC.shard{I}of{N}.{heads,labels}
# (umst-preprocess --shard I/N), then BPE_DIR/side/parse-shard{I}of{N}.done holding the parser and its
# arguments: a shard is complete when its .done file exists and names this run's parser.
shard_done_file() { echo "$BPE_DIR/side/parse-shard$1of$2.done"; }

# stage_parse_shard (--parse-shard I/N): parse one shard and return; what each array task runs.
stage_parse_shard() {
    local i="${PARSE_SHARD%/*}" n="${PARSE_SHARD#*/}" key="$PARSER:$PARSER_ARGS" done_file extra=()
    done_file="$(shard_done_file "$i" "$n")"
    if ! done_stage "bpe$MERGES"; then
        echo "[$NAME] --parse-shard $PARSE_SHARD: no BPE'd text in $BPE_DIR yet; run the same command with" \
             "--parse-shards $n instead of --parse-shard first (it stops before the parse)" >&2
        exit 2
    fi
    if [[ -f "$done_file" && "$(cat "$done_file")" == "$key" ]]; then
        say "parse shard $i of $n: done before ($done_file)"; return 0
    fi
    mkdir -p "$BPE_DIR/side"; rm -f "$done_file"
    parse_argv
    [[ -t 2 ]] || extra+=(--no-progress)  # a batch log gets the summary line (sentences/s), not a progress bar
    say "parse shard $i of $n with --parser $PARSER (resumes from its finished chunks when run again)"
    "$PY" -m umst_plugin.preprocess "${PARSE_ARGV[@]}" --shard "$i/$n" ${extra[@]+"${extra[@]}"}
    echo "$key" > "$done_file.tmp" && mv "$done_file.tmp" "$done_file"
    say "parse shard $i of $n: done ($done_file)"
}

# parse_shards_state: SHARDS_N (from --parse-shards, else from the .done files of an earlier array) and
# SHARDS_MISSING (the shards of those N that are not complete for this parser; empty: all there).
parse_shards_state() {
    local key="$PARSER:$PARSER_ARGS" i f
    SHARDS_N="$PARSE_SHARDS"; SHARDS_MISSING=()
    if [[ -z "$SHARDS_N" ]]; then
        for f in "$BPE_DIR/side"/parse-shard1of*.done; do
            [[ -f "$f" && "$(cat "$f")" == "$key" ]] || continue
            f="${f##*of}"; SHARDS_N="${f%.done}"; break
        done
    fi
    [[ -n "$SHARDS_N" ]] || return 0
    for (( i = 1; i <= SHARDS_N; i++ )); do
        f="$(shard_done_file "$i" "$SHARDS_N")"
        if [[ -f "$f" && "$(cat "$f")" != "$key" ]]; then
            say "shard $i of $SHARDS_N was parsed with '$(cat "$f")', not '$key': parse it again (or delete $f)"
        fi
        [[ -f "$f" && "$(cat "$f")" == "$key" ]] || SHARDS_MISSING+=("$i")
    done
    return 0
}

stage_binarize_and_parse() {
    local key="$PARSER:$PARSER_ARGS" binarize=() parse=() split testpref waiting=0
    testpref="$(test_prefixes)"
    if done_stage "binarize$MERGES"; then
        say "binarize: done before"
    else
        rm -rf "$DATABIN"
        binarize=(--source-lang "$SRC" --target-lang "$TGT" --trainpref "$BPE_DIR/train"
                  --validpref "$BPE_DIR/valid" --testpref "$testpref" --destdir "$DATABIN"
                  --joined-dictionary --workers "$WORKERS")
    fi
    if [[ ${#binarize[@]} -eq 0 ]] && done_stage "parse$MERGES" "$key"; then
        say "parse ($PARSER): done before"
    else
        if [[ "$PARSER" == conllu ]]; then
            "$PY" "$PREP" filter-conllu --keep "$WORK/tok/train.clean.keep" \
                "$CONLLU_DIR/train.$SRC.conllu" "$BPE_DIR/train.$SRC.conllu"
            for split in valid "${TEST_SPLITS[@]}"; do
                cp "$CONLLU_DIR/$split.$SRC.conllu" "$BPE_DIR/$split.$SRC.conllu"
            done
        fi
        parse_argv; parse=("${PARSE_ARGV[@]}")
        parse_shards_state
        if [[ -n "$SHARDS_N" && ${#SHARDS_MISSING[@]} -eq 0 ]]; then
            parse+=(--merge-shards "$SHARDS_N")
            say "dependency side data: merging the $SHARDS_N parse shards in $BPE_DIR/side (no parsing)"
        elif [[ -n "$SHARDS_N" ]]; then
            parse=(); waiting=1
        else
            say "dependency side data with --parser $PARSER"
        fi
    fi
    if [[ ${#binarize[@]} -gt 0 || ${#parse[@]} -gt 0 ]]; then
        rm -f "$WORK/.stamps/parse$MERGES"
        local nb=${#binarize[@]}
        "$PY" - "$WORK/.stamps/binarize$MERGES" "$nb" "${binarize[@]}" "${parse[@]}" <<'PYEOF'
import sys
stamp, nb = sys.argv[1], int(sys.argv[2])
binarize, parse = sys.argv[3:3 + nb], sys.argv[3 + nb:]
if binarize:  # fairseq-preprocess
    from fairseq_cli.preprocess import cli_main
    sys.argv = ["fairseq-preprocess"] + binarize
    cli_main()
    with open(stamp, "w") as f:
        f.write("done\n")
if parse:  # umst-preprocess
    from umst_plugin.preprocess.cli import main
    sys.exit(main(parse))
PYEOF
        [[ ${#parse[@]} -gt 0 ]] && mark_stage "parse$MERGES" "$key"
    fi
    if [[ "$waiting" -eq 1 ]]; then
        local missing="${SHARDS_MISSING[*]}"
        local gres=""  # stanza parses on a GPU when the task has one (docs/wmt-on-gpus.md)
        [[ "$PARSER" != stanza ]] || gres="--gres=gpu:1 "
        say "stopped before the parse: shard(s) ${missing// /,} of $SHARDS_N not parsed yet. Parse them, e.g. as" \
            "a Slurm array: sbatch --wait --array=${missing// /,} ${gres}scripts/slurm/parse-array.sbatch $(basename "$0" .sh | sed 's/^prepare-//')" \
            "$(printf '%q ' "${COMMON_ARGS[@]}")(or: bash $0 ... --parse-shard I/$SHARDS_N for each I); then run" \
            "this command again: it merges them and finishes"
        exit 0
    fi
    return 0
}

stage_stats() {
    local splits="train,valid" split
    for split in "${TEST_SPLITS[@]}"; do splits+=",$split"; done
    "$PY" "$PREP" stats --name "$NAME (bpe $MERGES)" --src "$SRC" --tgt "$TGT" --bpe-dir "$BPE_DIR" \
        --databin "$DATABIN" --splits "$splits" --output "$DATABIN/corpus-stats.json"
    # Everything evaluate.sh needs next to the data-bin: references and the BPE codes.
    mkdir -p "$DATABIN/ref"
    for split in valid "${TEST_SPLITS[@]}"; do
        cp "$WORK/tok/$split.$TGT" "$DATABIN/ref/$split.tok.$TGT"
        cp "$WORK/ref/$split.$TGT" "$DATABIN/ref/$split.detok.$TGT"
    done
    [[ -z "${TEST_SET:-}" ]] || echo "$TEST_SET" > "$DATABIN/ref/test.set"
    cp "$BPE_DIR/codes" "$DATABIN/bpe.codes"
}

# DATA_BIN/preprocessing.json: what the tokenize stage did (its own flags) and the BPE codes copied
# above, which the multiscale_translation task applies to raw input (fairseq-interactive,
# from_pretrained, umst-inspect --sentence; docs/inference.md). Cheap, so it runs every time: a re-run
# of the recipe adds the record to a data-bin made before records existed.
# DATA_BIN/source-parse.json (umst-preprocess's record of its parser and model) is folded into the record:
# from_pretrained then parses raw input with them. A data-bin parsed before that file existed gets it here.
stage_record() {
    local databin="${1:-$DATABIN}"
    if [[ "$databin" == "$DATABIN" && ! -f "$DATABIN/source-parse.json" ]] && done_stage "parse$MERGES" "$PARSER:$PARSER_ARGS"; then
        parse_argv
        "$PY" -m umst_plugin.preprocess "${PARSE_ARGV[@]}" --record-only
    fi
    local lang args=(--databin "$databin" --langs "$SRC" "$TGT" --bpe-codes bpe.codes --merges "$MERGES"
                     --written-by "scripts/$(basename "$0")" "${TOKENIZE_ARGS[@]+"${TOKENIZE_ARGS[@]}"}")
    for lang in "$SRC" "$TGT"; do romanian_lang "$lang" && args+=(--romanian-lang "$lang"); done
    "$PY" "$PREP" record "${args[@]}"
}

run_all_stages() {
    if [[ -n "$PARSE_SHARD" ]]; then stage_parse_shard; exit 0; fi
    stage_download
    stage_extract
    stage_tokenize
    stage_clean
    stage_bpe
    stage_binarize_and_parse
    stage_stats
    stage_record
    say "data-bin ready: $DATABIN"
}
