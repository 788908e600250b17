"""``umst-preprocess``: word-boundary and dependency side data for multiscale_translation.

Run it after ``fairseq-preprocess`` with the same prefixes and languages, so the
side data is checked token by token against the binarized source::

    fairseq-preprocess --source-lang en --target-lang de --trainpref bpe/train \\
        --validpref bpe/valid --testpref bpe/test --destdir data-bin --joined-dictionary
    umst-preprocess --source-lang en --target-lang de --trainpref bpe/train \\
        --validpref bpe/valid --testpref bpe/test --destdir data-bin --parser stanza

Input per split: the BPE source ``{pref}.{src}`` and, for ``--parser conllu``, its
parse ``{pref}.{src}{--conllu-suffix}``. Output: see ``sidefiles``. Model parsers
run in resumable chunks (``chunks``); ``--shard I/N`` parses one part of every
split and ``--merge-shards N`` joins the parts (see docs/preprocessing.md).
"""
import argparse
import collections
import itertools
import logging
import os
import sys
import time

from umst_plugin.data.word_boundaries import SCHEMES, detect_scheme
from umst_plugin.preprocess import parsers
from umst_plugin.preprocess.chunks import DEFAULT_WORK_ROOT, ChunkedParse, shard_range
from umst_plugin.preprocess.conllu_reader import read_conllu
from umst_plugin.preprocess.errors import ParserSetupError, SideDataError
from umst_plugin.preprocess.sidefiles import (HEADS, LABELS, AtomicWriter, ParseArrays, check_against_binarized,
                                              check_parses, parses_from_conllu, read_parse_text, side_prefix,
                                              write_parse_text, write_split)
from umst_plugin.preprocess.text import count_lines, read_bpe_lines, scan_bpe

logger = logging.getLogger("umst_plugin.preprocess")

MODEL_PARSERS = ("stanza", "spacy")


def shard_spec(value):
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {value!r}: expected I/N with integers, e.g. 2/8") from None
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"--shard {value!r}: expected 1 <= I <= N")
    return i, n


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
    p.add_argument("--text-dir", default=None, help="where the text side files (and shard outputs) go "
                   "(default: --destdir)")
    p.add_argument("--parser", default="auto", choices=["auto", "conllu"] + sorted(parsers.BACKENDS),
                   help="where heads come from: stanza = stanza Pipeline (the default parser); spacy = a spaCy "
                   "pipeline; conllu = read {pref}.{src}{--conllu-suffix}; none = fallback graph without edges; "
                   "auto = conllu when every split has its CoNLL-U file, else stanza (default: auto)")
    p.add_argument("--parser-model", default=None, help="model for the parser: a stanza language code or a "
                   "spaCy pipeline name/path (same as the task's --source-parser-model)")
    p.add_argument("--conllu-suffix", default=".conllu", help="suffix of the CoNLL-U parse files after "
                   "{pref}.{src} (default: .conllu)")
    p.add_argument("--bpe", default="auto", choices=("auto",) + SCHEMES,
                   help="subword marker scheme: subword-nmt '@@ ' continuation or sentencepiece '▁' word "
                   "start (default: auto, from the first 1,000 lines: sentencepiece where more pieces start with '▁' "
                   "than end with '@@')")
    p.add_argument("--no-check-forms", action="store_true", help="with --parser conllu, only check word counts, "
                   "not that the CoNLL-U forms equal the words rebuilt from the BPE text")
    p.add_argument("--no-check-binarized", action="store_true", help="do not require fairseq-preprocess output "
                   "in --destdir (the task still checks alignment when it loads the data)")
    g = p.add_argument_group("scale and resume (model parsers)")
    g.add_argument("--device", default="auto", help="device for model parsers: auto (GPU when available), cpu, "
                   "cuda, cuda:1 ... (default: auto)")
    g.add_argument("--batch-size", type=int, default=256, help="sentences per parser call (default: 256)")
    g.add_argument("--batch-tokens", type=int, default=0, help="also cap the words per parser call (0 = no cap; "
                   "stanza additionally uses it, or 5000, as its internal pos/depparse batch size)")
    g.add_argument("--max-words", type=int, default=0, help="sentences with more words get the fallback graph "
                   "instead of a parse (0 = parse all; default: 0)")
    g.add_argument("--workers", type=int, default=1, help="parser processes (CPU parsing; each loads its own "
                   "model; default: 1)")
    g.add_argument("--chunk-size", type=int, default=5000, help="sentences per resumable chunk (default: 5000); "
                   "keep it the same across the shards of one split")
    g.add_argument("--work-dir", default=None, help="where finished chunks are kept until the split is written "
                   "(default: {text-dir}/.umst-work)")
    g.add_argument("--shard", type=shard_spec, default=None, metavar="I/N",
                   help="parse only part I of N (1-based) of every split and write "
                   "{text-dir}/{split}.{src}.shard{I}of{N}.heads/.labels; join with --merge-shards N")
    g.add_argument("--merge-shards", type=int, default=None, metavar="N",
                   help="concatenate the N shard outputs of every split in order, check them line by line "
                   "against the BPE source and write the side files")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--record-only", action="store_true", help="only write DESTDIR/source-parse.json, the record "
                   "of which parser and model these arguments parse with (for a data-bin parsed before the "
                   "record existed); parses nothing")
    g.add_argument("--stop-after-chunks", type=int, default=None, help=argparse.SUPPRESS)  # tests: interrupt
    for backend in parsers.BACKENDS.values():
        backend.add_args(p)
    return p


SOURCE_PARSE_NAME = "source-parse.json"


def source_parse_record(args):
    """What parsed the source side, for DESTDIR/source-parse.json (folded into preprocessing.json by
    ``scripts/wmt_prep.py record``): the parser and the model it loaded, so that raw input at inference
    (``umst_plugin.from_pretrained``) is parsed the same way without guessing."""
    record = {"parser": args.parser, "model": None, "written_by": "umst-preprocess"}
    if args.parser == "spacy":
        from umst_plugin.preprocess.spacy_backend import DEFAULT_MODEL

        record["model"] = args.spacy_model or args.parser_model or DEFAULT_MODEL
    elif args.parser == "stanza":
        record["model"] = args.stanza_lang or args.parser_model or args.source_lang
        record["stanza_package"] = args.stanza_package
    elif args.parser == "conllu":
        record["conllu_suffix"] = args.conllu_suffix
    return record


def write_source_parse_record(writer, args):
    import json

    with open(writer.path(os.path.join(args.destdir, SOURCE_PARSE_NAME)), "w", encoding="utf-8") as f:
        json.dump(source_parse_record(args), f, indent=1, sort_keys=True)
        f.write("\n")


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


SNIFF_LINES = 1000


def sniff_scheme(path, lines=SNIFF_LINES):
    """The marker scheme of a BPE text (``--bpe auto``), by ``detect_scheme``'s count over its first ``lines``
    lines: one line can hold no marker, or a stray ``▁``."""
    pieces = [piece for _, line in itertools.islice(read_bpe_lines(path), lines) for piece in line]
    return detect_scheme(pieces)


def resolve_parser(args, splits):
    if args.parser != "auto":
        return args.parser
    if all(os.path.exists(f"{pref}.{args.source_lang}{args.conllu_suffix}") for _, pref in splits):
        return "conllu"
    return "stanza"


def shard_paths(text_dir, split, src, shard, n_shards):
    base = os.path.join(text_dir, f"{split}.{src}.shard{shard}of{n_shards}")
    return f"{base}.{HEADS}", f"{base}.{LABELS}"


class Summary:
    def __init__(self):
        self.sentences = self.words = self.subwords = 0
        self.fallbacks = collections.Counter()
        self.start = time.time()

    def add(self, scan, parses):
        self.sentences += len(scan)
        self.words += int(scan.n_words.sum())
        self.subwords += len(scan.word_ids)
        self.fallbacks.update(parses.fallbacks)

    def line(self):
        took = time.time() - self.start
        n_fb = sum(self.fallbacks.values())
        why = f" ({', '.join(f'{k}: {v}' for k, v in sorted(self.fallbacks.items()))})" if n_fb else ""
        return (f"summary: {self.sentences} sentences, {self.words} words, {self.subwords} subwords, "
                f"{n_fb} fallback graphs{why}, {took:.1f}s ({self.sentences / max(took, 1e-9):.0f} sentences/s)")


class Run:
    def __init__(self, args):
        self.args = args
        self.src, self.tgt = args.source_lang, args.target_lang
        self.text_dir = args.text_dir or args.destdir
        self.writer = AtomicWriter()
        self.summary = Summary()
        self.chunked = []

    def progress(self, split):
        from tqdm import tqdm

        def make(total, initial=0):
            return tqdm(total=total, initial=initial, unit="sent", desc=f"parsing {split}", mininterval=1.0,
                        smoothing=0.05, disable=self.args.no_progress, dynamic_ncols=True)
        return make

    def parses(self, split, pref, bpe_path, scheme, scan, start, stop):
        args = self.args
        if args.parser == "conllu":
            path = f"{pref}.{self.src}{args.conllu_suffix}"
            if not os.path.exists(path):
                raise SideDataError(path, None, "no such CoNLL-U file; expected the parse of "
                                    f"{bpe_path} (or choose another --parser)")
            return parses_from_conllu(bpe_path, read_conllu(path), path, scheme,
                                      check_forms=not args.no_check_forms, start=start, stop=stop)
        if args.parser == "none":
            return ParseArrays.fallback(scan.n_words, source="--parser none")
        work_root = args.work_dir or os.path.join(self.text_dir, DEFAULT_WORK_ROOT)
        # Each shard keeps its chunks in a folder of its own: shards run at the same time (a Slurm array), and a
        # shard that finishes removes its folder, which must never be one another shard is about to write into.
        name = f"{split}.{self.src}" + (".shard{}of{}".format(*args.shard) if args.shard else "")
        chunked = ChunkedParse(args, bpe_path, scheme, start, stop, os.path.join(work_root, name))
        self.chunked.append(chunked)
        return chunked.run(self.progress(split))

    def split(self, split, pref):
        args = self.args
        bpe_path = f"{pref}.{self.src}"
        if not os.path.exists(bpe_path):
            raise SideDataError(bpe_path, None, f"no such file; expected the BPE source text of split {split!r}")
        scheme = sniff_scheme(bpe_path) if args.bpe == "auto" else args.bpe
        if args.shard:
            shard, n_shards = args.shard
            start, stop = shard_range(count_lines(bpe_path), args.chunk_size, shard, n_shards)
        else:
            start, stop = 0, None
        scan = scan_bpe(bpe_path, scheme, start, stop)
        stop = start + len(scan)
        if args.merge_shards:
            parses = self.merged_shards(split, scan)
        else:
            parses = self.parses(split, pref, bpe_path, scheme, scan, start, stop)
            check_parses(scan, parses)
        if args.shard:
            heads_path, _ = shard_paths(self.text_dir, split, self.src, *args.shard)
            write_parse_text(self.writer, heads_path[:-len(HEADS) - 1], parses)
            where = f"lines {start + 1}-{stop} -> {heads_path}"
        else:
            bin_prefix = side_prefix(args.destdir, split, self.src, self.tgt)
            checked = check_against_binarized(scan, bin_prefix, bpe_path)
            if not checked and not args.no_check_binarized:
                raise SideDataError(bin_prefix + ".bin", None, "binarized source not found; run "
                                    "fairseq-preprocess first with the same prefixes and --destdir, or pass "
                                    "--no-check-binarized")
            write_split(self.writer, scan, parses, os.path.join(self.text_dir, f"{split}.{self.src}"), bin_prefix)
            where = args.destdir
        self.summary.add(scan, parses)
        n_fb = sum(parses.fallbacks.values())
        logger.info(f"{split}: {len(scan)} sentences, {int(scan.n_words.sum())} words, {len(scan.word_ids)} "
                    f"subwords, {n_fb} fallback graphs ({scheme}; heads from {parses.source}; {where})")

    def merged_shards(self, split, scan):
        n = self.args.merge_shards
        parts, offset = [], 0
        for shard in range(1, n + 1):
            heads_path, labels_path = shard_paths(self.text_dir, split, self.src, shard, n)
            for path in (heads_path, labels_path):
                if not os.path.exists(path):
                    raise SideDataError(path, None, f"shard {shard} of {n} missing; expected the output of "
                                        f"umst-preprocess ... --shard {shard}/{n} (copied into {self.text_dir})")
            part = read_parse_text(heads_path, labels_path)
            if offset + len(part) > len(scan):
                raise SideDataError(heads_path, len(scan) - offset + 1, f"shards 1-{shard} have more lines than "
                                    f"the {len(scan)} lines of {scan.path}; expected shards of this file, in order")
            check_parses(scan.slice(offset, offset + len(part)), part, parse_path=heads_path)
            parts.append(part)
            offset += len(part)
        if offset != len(scan):
            raise SideDataError(scan.path, offset + 1, f"the {n} shards hold {offset} lines but the BPE text has "
                                f"{len(scan)}; expected all shards of this file")
        return ParseArrays.concatenate(parts, source=f"{n} shards")

    def __call__(self):
        args = self.args
        splits = splits_from_args(args)
        if not splits:
            raise SystemExit("umst-preprocess: give at least one of --trainpref, --validpref, --testpref")
        if args.shard and args.merge_shards:
            raise SystemExit("umst-preprocess: --shard and --merge-shards exclude each other")
        args.parser = resolve_parser(args, splits)
        if args.record_only:
            os.makedirs(args.destdir, exist_ok=True)
            write_source_parse_record(self.writer, args)
            self.writer.commit()
            logger.info(f"{os.path.join(args.destdir, SOURCE_PARSE_NAME)}: {source_parse_record(args)}")
            return
        os.makedirs(args.destdir, exist_ok=True)
        os.makedirs(self.text_dir, exist_ok=True)
        try:
            for split, pref in splits:
                self.split(split, pref)
            if not args.shard:  # the data-bin's record of what parsed it (shards: the merge run writes it)
                write_source_parse_record(self.writer, args)
            self.writer.commit()
        except BaseException:
            self.writer.abort()
            raise
        for chunked in self.chunked:
            chunked.cleanup()
        logger.info(self.summary.line())


def run(args):
    Run(args)()


def main(argv=None):
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stdout)
    args = get_parser().parse_args(argv)
    try:
        run(args)
    except (SideDataError, ParserSetupError) as e:
        print(f"umst-preprocess: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"umst-preprocess: interrupted{': ' + str(e) if str(e) else ''}; finished chunks are kept, "
              "rerun the same command to continue", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
