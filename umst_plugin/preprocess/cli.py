"""``umst-preprocess``: word-boundary and dependency side data for multiscale_translation.

Run it after ``fairseq-preprocess`` with the same prefixes and languages, so the
side data is checked token by token against the binarized source::

    fairseq-preprocess --source-lang en --target-lang de --trainpref bpe/train \\
        --validpref bpe/valid --testpref bpe/test --destdir data-bin --joined-dictionary
    umst-preprocess --source-lang en --target-lang de --trainpref bpe/train \\
        --validpref bpe/valid --testpref bpe/test --destdir data-bin --parser conllu

Input per split: the BPE source ``{pref}.{src}`` and, for ``--parser conllu``, its
parse ``{pref}.{src}{--conllu-suffix}``. Output: see ``sidefiles``.
"""
import argparse
import logging
import os
import sys
import time

from umst_plugin.data.word_boundaries import SCHEMES, detect_scheme
from umst_plugin.preprocess import parsers
from umst_plugin.preprocess.conllu_reader import read_conllu
from umst_plugin.preprocess.errors import SideDataError
from umst_plugin.preprocess.sidefiles import (AtomicWriter, check_against_binarized, collect_split,
                                              side_prefix, write_split)
from umst_plugin.preprocess.text import parser_words, read_bpe_lines

logger = logging.getLogger("umst_plugin.preprocess")


def get_parser():
    p = argparse.ArgumentParser(
        prog="umst-preprocess",
        description="Write word-id, dependency-head and label side files (text and binarized) for the "
        "multiscale_translation task. Run after fairseq-preprocess with the same prefixes.")
    p.add_argument("-s", "--source-lang", required=True, help="source language suffix (e.g. en)")
    p.add_argument("-t", "--target-lang", required=True, help="target language suffix (e.g. de)")
    p.add_argument("--trainpref", help="train file prefix (BPE text): reads {trainpref}.{source-lang}")
    p.add_argument("--validpref", help="comma-separated valid prefixes (valid, valid1, ...)")
    p.add_argument("--testpref", help="comma-separated test prefixes (test, test1, ...)")
    p.add_argument("--destdir", default="data-bin", help="fairseq data-bin directory to write the binarized "
                   "side data into (default: data-bin)")
    p.add_argument("--text-dir", default=None, help="where the text side files go (default: --destdir)")
    p.add_argument("--parser", default="conllu", choices=sorted(set(parsers.BACKENDS) | {"conllu"}),
                   help="where heads come from: conllu = read {pref}.{src}{--conllu-suffix}; "
                   "none = fallback graph without edges; model backends parse the words (default: conllu)")
    p.add_argument("--conllu-suffix", default=".conllu", help="suffix of the CoNLL-U parse files after "
                   "{pref}.{src} (default: .conllu)")
    p.add_argument("--bpe", default="auto", choices=("auto",) + SCHEMES,
                   help="subword marker scheme: subword-nmt '@@ ' continuation or sentencepiece '▁' word "
                   "start (default: auto, from the text)")
    p.add_argument("--no-check-forms", action="store_true", help="with --parser conllu, only check word counts, "
                   "not that the CoNLL-U forms equal the words rebuilt from the BPE text")
    p.add_argument("--no-check-binarized", action="store_true", help="do not require fairseq-preprocess output "
                   "in --destdir (the task still checks alignment when it loads the data)")
    for backend in parsers.BACKENDS.values():
        backend.add_args(p)
    return p


def splits_from_args(args):
    splits = []
    if args.trainpref:
        splits.append(("train", args.trainpref))
    for kind in ("valid", "test"):
        prefs = getattr(args, f"{kind}pref")
        if prefs:
            for k, pref in enumerate(prefs.split(",")):
                splits.append((kind if k == 0 else f"{kind}{k}", pref))
    return splits


def sniff_scheme(path):
    for _, pieces in read_bpe_lines(path):
        return detect_scheme(pieces)
    return detect_scheme([])


def parses_for(args, backend, pref, bpe_path, scheme):
    """(iterable of parses, name of their source) for one split."""
    if args.parser == "conllu":
        path = f"{pref}.{args.source_lang}{args.conllu_suffix}"
        if not os.path.exists(path):
            raise SideDataError(path, None, "no such CoNLL-U file; expected the parse of "
                                f"{bpe_path} (or choose another --parser)")
        return read_conllu(path), path
    sentences = [parser_words(pieces, scheme) for _, pieces in read_bpe_lines(bpe_path)]
    return backend.parse(sentences), f"parser {args.parser!r}"


def run(args):
    src, tgt = args.source_lang, args.target_lang
    splits = splits_from_args(args)
    if not splits:
        raise SystemExit("umst-preprocess: give at least one of --trainpref, --validpref, --testpref")
    os.makedirs(args.destdir, exist_ok=True)
    text_dir = args.text_dir or args.destdir
    os.makedirs(text_dir, exist_ok=True)
    backend = None if args.parser == "conllu" else parsers.build_backend(args.parser, args)
    writer = AtomicWriter()
    start = time.time()
    try:
        for split, pref in splits:
            bpe_path = f"{pref}.{src}"
            if not os.path.exists(bpe_path):
                raise SideDataError(bpe_path, None, "no such file; expected the BPE source text of split "
                                    f"{split!r}")
            scheme = sniff_scheme(bpe_path) if args.bpe == "auto" else args.bpe
            parses, parse_source = parses_for(args, backend, pref, bpe_path, scheme)
            data = collect_split(bpe_path, parses, scheme, parse_source,
                                 check_forms=args.parser == "conllu" and not args.no_check_forms)
            bin_prefix = side_prefix(args.destdir, split, src, tgt)
            checked = check_against_binarized(data, bin_prefix, bpe_path)
            if not checked and not args.no_check_binarized:
                raise SideDataError(bin_prefix + ".bin", None, "binarized source not found; run "
                                    "fairseq-preprocess first with the same prefixes and --destdir, or pass "
                                    "--no-check-binarized")
            write_split(writer, data, os.path.join(text_dir, f"{split}.{src}"), bin_prefix)
            n_words = sum(data.head_sizes)
            logger.info(f"{split}: {len(data)} sentences, {n_words} words, {len(data.word_ids)} subwords "
                        f"({scheme}; heads from {parse_source})")
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    logger.info(f"done in {time.time() - start:.1f}s; side data in {args.destdir}")


def main(argv=None):
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stdout)
    args = get_parser().parse_args(argv)
    try:
        run(args)
    except SideDataError as e:
        print(f"umst-preprocess: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
