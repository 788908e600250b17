#!/usr/bin/env python3
"""Text stages of the WMT recipes (called by prepare-wmt14-en-de.sh / prepare-wmt16-en-ro.sh).

Pure-Python ports of the Moses/WMT16 scripts the papers' pipelines use, so the
recipes need no Perl checkout:

* ``sgm``: segments of a WMT ``.sgm`` file, one per line (what fairseq's
  prepare-wmt14en2de.sh does with grep/sed).
* ``tokenize``: normalize-punctuation.perl, remove-non-printing-char.perl,
  for Romanian normalise-romanian.py + remove-diacritics.py (Sennrich's
  wmt16-scripts, the Lee et al. 2018 / Kasai et al. 2020 setup), then
  tokenizer.perl -a (aggressive hyphen splitting, as fairseq's recipe), via sacremoses.
* ``record``: DATA_BIN/preprocessing.json, what ``tokenize`` did and the BPE codes, which the
  multiscale_translation task applies to raw input (umst_plugin/text_preprocessing.py, whose
  LinePreparer is also what ``tokenize`` runs).
* ``lowercase``: lowercase a file (the detokenized reference of the lowercased Multi30k recipe).
* ``normalize-ro``: only the Romanian normalisation and diacritic removal, for
  the detokenized reference that sacrebleu scores against.
* ``clean``: clean-corpus-n.perl (drop empty lines, lines longer than --max
  tokens and pairs whose length ratio exceeds --ratio); writes the kept line
  numbers so parses of the uncleaned corpus can follow (``filter-conllu``).
* ``stats``: the corpus statistics the papers quote.
"""
import argparse
import json
import os
import re
import sys
from multiprocessing import Pool


def _load_text_preprocessing():
    """The plugin's ``umst_plugin/text_preprocessing.py``, loaded as a module of its own.

    It imports only the standard library (sacremoses and subword-nmt where a step uses them). Imported as
    ``umst_plugin.text_preprocessing`` it would first run the plugin's ``__init__``, which imports fairseq and
    registers every arch: 18 s a process on 2 cores, and the recipes run this tool once per file and step, tens of
    times per prepare. The plugin keeps the file (its task and hub read the same record at load time); this is
    the same code, loaded without the plugin."""
    import importlib.util

    package = importlib.util.find_spec("umst_plugin")  # a top-level package's spec: nothing is imported
    path = os.path.join(package.submodule_search_locations[0], "text_preprocessing.py")
    name = "umst_tools._text_preprocessing"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses look their module up while the file runs)
    spec.loader.exec_module(module)
    return module


textprep = _load_text_preprocessing()

SEG = re.compile(r"<seg[^>]*>\s*(.*?)\s*</seg>", re.I)


def atomic_open(path):
    """Write to PATH.tmp; the caller renames on success (so a crashed stage leaves no half file)."""
    return open(path + ".tmp", "w", encoding="utf-8")


def commit(path):
    os.replace(path + ".tmp", path)


# ---- sgm ------------------------------------------------------------------------------------

def cmd_sgm(args):
    n = 0
    with open(args.input, encoding="utf-8") as fin, atomic_open(args.output) as fout:
        for line in fin:
            m = SEG.search(line)
            if m:
                fout.write(m.group(1).replace("\u2019", "'") + "\n")  # fairseq recipe: sed "s/\’/\'/g"
                n += 1
    commit(args.output)
    print(f"{args.output}: {n} segments", file=sys.stderr)


# ---- normalisation and tokenization ---------------------------------------------------------

normalise_romanian = textprep.normalise_romanian
remove_romanian_diacritics = textprep.remove_romanian_diacritics
remove_non_printing = textprep.remove_non_printing

_WORKER = {}


def _init_worker(lang, romanian, lowercase=False, aggressive_dashes=True):
    _WORKER["prepare"] = textprep.LinePreparer(lang, romanian=romanian, lowercase=lowercase,
                                               aggressive_dash_splits=aggressive_dashes)


def _process(line):
    return _WORKER["prepare"](line)


def map_lines(args, func, init_args):
    # Set up in this process first: a set-up that fails here (sacremoses missing) stops with its error,
    # where a Pool would restart its failing workers forever and the recipe would hang.
    try:
        _init_worker(*init_args)
    except ImportError as e:
        raise SystemExit(f"{args.input}: cannot tokenize: {e} (the recipes need sacremoses and subword-nmt: "
                         f"bash scripts/setup_env.sh, or pip install -e '.[recipes]' into {sys.executable})")
    with open(args.input, encoding="utf-8") as fin, atomic_open(args.output) as fout:
        if args.workers <= 1:
            for line in fin:
                fout.write(func(line) + "\n")
        else:
            with Pool(args.workers, initializer=_init_worker, initargs=init_args) as pool:
                for out in pool.imap(func, fin, chunksize=2000):
                    fout.write(out + "\n")
    commit(args.output)


def cmd_tokenize(args):
    map_lines(args, _process, (args.lang, args.romanian, args.lowercase, not args.no_aggressive_dashes))


def cmd_record(args):
    """DATABIN/preprocessing.json: what the tokenize stage did (the same flags) and the BPE codes, read by
    the multiscale_translation task to prepare raw input (fairseq-interactive, from_pretrained)."""
    try:
        path = textprep.write_record(
            args.databin, args.langs, lowercase=args.lowercase, aggressive_dash_splits=not args.no_aggressive_dashes,
            romanian=args.romanian_lang, bpe_codes=args.bpe_codes, merges=args.merges, written_by=args.written_by)
        record = textprep.read_record(args.databin)
    except textprep.RecordError as e:
        raise SystemExit(f"record: {e}")
    for lang in record.languages:
        print(f"{path}: {lang}: {record.describe(lang)}", file=sys.stderr)


def cmd_lowercase(args):
    """Lowercase only (the detokenized reference of a lowercased recipe)."""
    with open(args.input, encoding="utf-8") as fin, atomic_open(args.output) as fout:
        for line in fin:
            fout.write(line.rstrip("\n").lower() + "\n")
    commit(args.output)


def cmd_normalize_ro(args):
    with open(args.input, encoding="utf-8") as fin, atomic_open(args.output) as fout:
        for line in fin:
            fout.write(remove_romanian_diacritics(normalise_romanian(line.rstrip("\n"))) + "\n")
    commit(args.output)


# ---- cleaning -------------------------------------------------------------------------------

def cmd_clean(args):
    """clean-corpus-n.perl -ratio R CORPUS L1 L2 OUT MIN MAX."""
    src_in, tgt_in = f"{args.corpus}.{args.l1}", f"{args.corpus}.{args.l2}"
    src_out, tgt_out = f"{args.out}.{args.l1}", f"{args.out}.{args.l2}"
    kept = total = 0
    with open(src_in, encoding="utf-8") as fs, open(tgt_in, encoding="utf-8") as ft, \
            atomic_open(src_out) as os_, atomic_open(tgt_out) as ot, atomic_open(args.keep_file) as ok:
        for i, (s, t) in enumerate(zip(fs, ft)):
            total += 1
            s, t = " ".join(s.split()), " ".join(t.split())
            ns, nt = len(s.split()), len(t.split())
            if not (args.min <= ns <= args.max and args.min <= nt <= args.max):
                continue
            if ns / nt > args.ratio or nt / ns > args.ratio:
                continue
            os_.write(s + "\n")
            ot.write(t + "\n")
            ok.write(f"{i}\n")
            kept += 1
        if next(fs, None) is not None or next(ft, None) is not None:
            raise SystemExit(f"clean: {src_in} and {tgt_in} have different line counts")
    for p in (src_out, tgt_out, args.keep_file):
        commit(p)
    print(f"clean: kept {kept} of {total} sentence pairs (ratio {args.ratio}, length {args.min}-{args.max})",
          file=sys.stderr)


def cmd_filter_conllu(args):
    """Keep the CoNLL-U sentences whose 0-based index is listed in --keep (one per line)."""
    with open(args.keep, encoding="utf-8") as f:
        keep = {int(x) for x in f if x.strip()}
    block, index, written = [], 0, 0
    with open(args.input, encoding="utf-8") as fin, atomic_open(args.output) as fout:
        for line in list(fin) + ["\n"]:
            if line.strip():
                block.append(line)
                continue
            if block:
                if index in keep:
                    fout.write("".join(block) + "\n")
                    written += 1
                index, block = index + 1, []
    if written != len(keep):
        raise SystemExit(f"filter-conllu: {args.input} has {index} sentences; {len(keep)} kept indices but only "
                         f"{written} found (is it the parse of the uncleaned corpus?)")
    commit(args.output)


# ---- statistics -----------------------------------------------------------------------------

def count_file(path):
    lines = tokens = words = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            lines += 1
            pieces = line.split()
            tokens += len(pieces)
            words += sum(1 for p in pieces if not p.endswith("@@"))
    return lines, tokens, words


def dict_size(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f) + 4  # + <s>, <pad>, </s>, <unk>


def cmd_stats(args):
    stats = {"name": args.name, "splits": {}}
    for split in args.splits.split(","):
        entry = {}
        for lang in (args.src, args.tgt):
            path = os.path.join(args.bpe_dir, f"{split}.{lang}")
            if os.path.exists(path):
                lines, tokens, words = count_file(path)
                entry.update({"sentences": lines, f"{lang}_subwords": tokens, f"{lang}_words": words})
        stats["splits"][split] = entry
    d = os.path.join(args.databin, f"dict.{args.src}.txt")
    if os.path.exists(d):
        stats["joined_dictionary"] = dict_size(d)
    with atomic_open(args.output) as f:
        json.dump(stats, f, indent=1)
    commit(args.output)
    print(f"== {args.name}")
    for split, e in stats["splits"].items():
        if e:
            print(f"  {split:6s} {e['sentences']:>10,d} sentence pairs   "
                  f"{args.src}: {e.get(args.src + '_words', 0):,d} words / {e.get(args.src + '_subwords', 0):,d} "
                  f"subwords   {args.tgt}: {e.get(args.tgt + '_subwords', 0):,d} subwords")
    if "joined_dictionary" in stats:
        print(f"  joined dictionary: {stats['joined_dictionary']:,d} types (incl. 4 specials)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sgm")
    s.add_argument("input")
    s.add_argument("output")
    s.set_defaults(func=cmd_sgm)
    s = sub.add_parser("tokenize")
    s.add_argument("--lang", required=True)
    s.add_argument("--romanian", action="store_true", help="normalise-romanian + remove-diacritics first")
    s.add_argument("--lowercase", action="store_true", help="lowercase after normalisation (Multi30k's tok files)")
    s.add_argument("--no-aggressive-dashes", action="store_true",
                   help="tokenizer.perl without -a (hyphenated words stay one token)")
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("input")
    s.add_argument("output")
    s.set_defaults(func=cmd_tokenize)
    s = sub.add_parser("record", help="write DATABIN/preprocessing.json (how the text was prepared)")
    s.add_argument("--databin", required=True)
    s.add_argument("--langs", nargs="+", required=True, help="the data-bin's languages, e.g. en de")
    s.add_argument("--lowercase", action="store_true", help="the tokenize stage lowercased (as its --lowercase)")
    s.add_argument("--no-aggressive-dashes", action="store_true", help="as the tokenize stage's flag")
    s.add_argument("--romanian-lang", action="append", default=[], metavar="LANG",
                   help="a language the tokenize stage ran with --romanian (repeatable)")
    s.add_argument("--bpe-codes", default="bpe.codes", help="subword-nmt codes, relative to --databin "
                   "(default: bpe.codes, where the recipes copy them)")
    s.add_argument("--merges", type=int, default=None, help="the number of BPE merges (for the reader)")
    s.add_argument("--written-by", default="", help="what made the data-bin (e.g. the recipe's name)")
    s.set_defaults(func=cmd_record)
    s = sub.add_parser("lowercase")
    s.add_argument("input")
    s.add_argument("output")
    s.set_defaults(func=cmd_lowercase)
    s = sub.add_parser("normalize-ro")
    s.add_argument("input")
    s.add_argument("output")
    s.set_defaults(func=cmd_normalize_ro)
    s = sub.add_parser("clean")
    s.add_argument("--ratio", type=float, default=1.5)
    s.add_argument("--min", type=int, default=1)
    s.add_argument("--max", type=int, default=250)
    s.add_argument("--keep-file", required=True)
    s.add_argument("corpus")
    s.add_argument("l1")
    s.add_argument("l2")
    s.add_argument("out")
    s.set_defaults(func=cmd_clean)
    s = sub.add_parser("filter-conllu")
    s.add_argument("--keep", required=True)
    s.add_argument("input")
    s.add_argument("output")
    s.set_defaults(func=cmd_filter_conllu)
    s = sub.add_parser("stats")
    s.add_argument("--name", required=True)
    s.add_argument("--src", required=True)
    s.add_argument("--tgt", required=True)
    s.add_argument("--bpe-dir", required=True)
    s.add_argument("--databin", required=True)
    s.add_argument("--splits", default="train,valid,test")
    s.add_argument("--output", required=True)
    s.set_defaults(func=cmd_stats)
    args = p.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
