"""Throughput of umst-preprocess: the side-file writer alone and each parser available here.

    python benchmarks/bench_preprocess.py                 # 200k sentences for the writer, 600 for parsers
    python benchmarks/bench_preprocess.py --sentences 1000000 --parser-sentences 2000

Writer (one core, parse already given as arrays): BPE text -> word ids (vectorised scan) -> checks
against the parse -> binarized mmap files, and the same plus the three text side files. The target
in issue 3 is >= 50,000 sentences/s for BPE -> word ids -> binarized.
Parsers: sentences/s of ``safe_parse`` in chunks as ``umst-preprocess`` runs it (model load excluded),
on Moses-tokenized, BPE'd English (the test sentences, varied).
"""
import argparse
import os
import random
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def synthetic_corpus(path, n, seed=0):
    """WMT-like lines: ~25 words, ~15% split into 2-3 subword-nmt pieces, Moses escapes."""
    rng = random.Random(seed)
    vocab = [f"w{k}" for k in range(5000)] + ["&apos;s", "&quot;", ",", ".", "&amp;"]
    lines = []
    for _ in range(n):
        pieces = []
        for _ in range(max(1, int(rng.gauss(25, 10)))):
            w = rng.choice(vocab)
            r = rng.random()
            if r < 0.10:
                pieces += [w + "@@", "ab"]
            elif r < 0.15:
                pieces += [w + "@@", "cd@@", "ef"]
            else:
                pieces.append(w)
        lines.append(" ".join(pieces))
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def given_parse(scan, seed=0):
    from umst_plugin.preprocess.sidefiles import ParseArrays

    rng = np.random.default_rng(seed)
    n = scan.n_words
    limit = np.repeat(n, n)
    heads = (rng.random(len(limit)) * (limit + 1)).astype(np.int32)  # any head in [0, n]
    labels = [" ".join(["dep"] * int(k)) for k in n]
    return ParseArrays(heads, n, labels)


def best_of(repeats, fn):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_writer(n, repeats, rows):
    from umst_plugin.preprocess.sidefiles import (AtomicWriter, HEADS, WORD_IDS, check_parses, write_binarized,
                                                  write_split)
    from umst_plugin.preprocess.text import scan_bpe

    with tempfile.TemporaryDirectory() as d:
        bpe = os.path.join(d, "train.en")
        synthetic_corpus(bpe, n)
        mb = os.path.getsize(bpe) / 2 ** 20
        parse = given_parse(scan_bpe(bpe, "subword-nmt"))

        def scan_only():
            scan_bpe(bpe, "subword-nmt")

        def binarized():
            scan = scan_bpe(bpe, "subword-nmt")
            check_parses(scan, parse)
            w = AtomicWriter()
            prefix = os.path.join(d, "train.en-de.en")
            write_binarized(w, f"{prefix}.{WORD_IDS}", scan.word_ids, scan.n_tokens)
            write_binarized(w, f"{prefix}.{HEADS}", parse.heads, parse.sizes)
            w.commit()

        def everything():
            scan = scan_bpe(bpe, "subword-nmt")
            check_parses(scan, parse)
            w = AtomicWriter()
            write_split(w, scan, parse, os.path.join(d, "train.en"), os.path.join(d, "train.en-de.en"))
            w.commit()

        def cli_none():
            from umst_plugin.preprocess import cli

            assert cli.main(["-s", "en", "-t", "de", "--trainpref", os.path.join(d, "train"), "--destdir",
                             os.path.join(d, "bin"), "--parser", "none", "--no-check-binarized", "--no-progress"]) == 0

        for name, fn in [("BPE -> word ids (scan)", scan_only),
                         ("BPE -> word ids -> binarized (parse given)", binarized),
                         ("... + text side files (wordids/heads/labels)", everything),
                         ("umst-preprocess --parser none (whole CLI run)", cli_none)]:
            t = best_of(repeats, fn)
            rows.append((f"writer: {name}", n, f"{t:.2f}", f"{n / t:,.0f}", f"{mb:.0f} MiB BPE"))
        # peak memory of a whole run, in its own process (imports included)
        import resource
        import subprocess

        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "umst_plugin.preprocess", "-s", "en", "-t", "de", "--trainpref",
                        os.path.join(d, "train"), "--destdir", os.path.join(d, "bin2"), "--parser", "none",
                        "--no-check-binarized", "--no-progress"], check=True, cwd=root, capture_output=True,
                       env={**os.environ, "PYTHONPATH": root})
        t = time.perf_counter() - t
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2 ** 10
        rows.append(("writer: the same CLI run as a new process", n, f"{t:.2f}", f"{n / t:,.0f}",
                     f"peak RSS {peak:,.0f} MiB (imports included)"))


def english_sentences(n):
    from umst_plugin.preprocess.text import parser_words

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from test_parsers import ENGLISH_BPE

    base = ENGLISH_BPE.splitlines()
    return [parser_words((base[k % len(base)][:-2] + f" , item {k} .").split(), "subword-nmt") for k in range(n)]


def bench_parsers(n, rows, batch_size):
    from argparse import Namespace

    from umst_plugin.preprocess import parsers
    from umst_plugin.preprocess.chunks import parse_sentences
    from umst_plugin.preprocess.errors import ParserSetupError

    sentences = english_sentences(n)
    for name in ("spacy", "stanza"):
        args = Namespace(parser=name, parser_model="en", batch_size=batch_size, batch_tokens=0, max_words=0,
                         device="auto")
        if name == "spacy":
            args.parser_model = None
        try:
            t = time.perf_counter()
            backend = parsers.build_backend(name, args)
            load = time.perf_counter() - t
        except ParserSetupError as e:
            rows.append((f"parser: {name}", n, "-", "not available", str(e).split(".")[0][:70]))
            continue
        parse_sentences(backend, sentences[:32], args)  # warm-up
        t = time.perf_counter()
        out = parse_sentences(backend, sentences, args)
        t = time.perf_counter() - t
        fb = sum(p.fallback is not None for p in out)
        rows.append((f"parser: {name} (1 process, batch {batch_size})", n, f"{t:.2f}", f"{n / t:,.0f}",
                     f"load {load:.1f}s, {fb} fallbacks"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=200_000)
    p.add_argument("--parser-sentences", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-parsers", action="store_true")
    args = p.parse_args(argv)
    import logging

    import torch

    torch.set_num_threads(1)
    logging.disable(logging.INFO)
    rows = []
    bench_writer(args.sentences, args.repeats, rows)
    if not args.no_parsers:
        bench_parsers(args.parser_sentences, rows, args.batch_size)
    header = ("what", "sentences", "seconds", "sentences/s", "note")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print(" | ".join(str(x).ljust(w) for x, w in zip(r, widths)))


if __name__ == "__main__":
    main()
