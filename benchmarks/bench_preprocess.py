"""Throughput of umst-preprocess: the side-file writer alone and each parser available here.

    python -m benchmarks preprocess                 # 200k sentences for the writer, 600 for parsers
    python -m benchmarks preprocess --sentences 1000000 --parser-sentences 2000
    taskset -c 0 python -m benchmarks preprocess --no-writer --parsers spacy --parser-sentences 5000 \
        --repeats 2 --parser-text ../shared/data/multi30k/train.en.gz --json docs/results/parse-rate-spacy-cpu.json

Writer (one core, parse already given as arrays): BPE text -> word ids (vectorised scan) -> checks
against the parse -> binarized mmap files, and the same plus the three text side files. The target
in issue 3 is >= 50,000 sentences/s for BPE -> word ids -> binarized.
Parsers: sentences/s and words/s of ``safe_parse`` in chunks as ``umst-preprocess`` runs it (model load
excluded), per wall second and per CPU second of the process (one core's rate, whatever else the machine
runs), on Moses-tokenized, BPE'd English (the test sentences, varied), or with ``--parser-text`` on the
first N lines of a raw English file (plain or .gz) Moses-tokenized as the WMT recipes do (aggressive dash
splits), the words the parser sees (escapes undone). Words/s is what carries over to a corpus of other
sentence lengths: the parsers' cost grows with the words.
"""
import argparse
import os
import random
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np


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


ROOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine():
    """What the numbers were measured on: CPU model, the cores this process may use, the load, versions."""
    import platform

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    out = {"cpu": cpu, "cores_usable": len(os.sched_getaffinity(0)), "cores_machine": os.cpu_count(),
           "load_average_1min": round(os.getloadavg()[0], 2), "python": platform.python_version()}
    for module in ("spacy", "torch", "stanza"):
        try:
            out[module] = __import__(module).__version__
        except ImportError:
            pass
    return out


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

    from tests.test_parsers import ENGLISH_BPE

    base = ENGLISH_BPE.splitlines()
    return [parser_words((base[k % len(base)][:-2] + f" , item {k} .").split(), "subword-nmt") for k in range(n)]


def raw_english_sentences(path, n):
    """The first ``n`` non-empty lines of ``path`` as the parser sees them after the WMT recipes' tokenize stage
    (Moses, aggressive dash splits; the parser reads the words with the escapes undone)."""
    import gzip

    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang="en")
    out = []
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(tok.tokenize(line.strip(), aggressive_dash_splits=True, escape=False))
                if len(out) == n:
                    break
    if len(out) < n:
        raise SystemExit(f"{path}: {len(out)} non-empty lines; expected at least --parser-sentences {n}")
    return out


def bench_parsers(n, rows, batch_size, names=("spacy", "stanza"), text=None, results=None, repeats=1):
    from argparse import Namespace

    from umst_plugin.preprocess import parsers
    from umst_plugin.preprocess.chunks import parse_sentences
    from umst_plugin.preprocess.errors import ParserSetupError

    sentences = raw_english_sentences(text, n) if text else english_sentences(n)
    n_words = sum(map(len, sentences))
    for name in names:
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
        runs = []
        for _ in range(repeats):
            t, cpu = time.perf_counter(), time.process_time()
            out = parse_sentences(backend, sentences, args)
            runs.append((time.perf_counter() - t, time.process_time() - cpu))
        t, cpu = min(r[0] for r in runs), min(r[1] for r in runs)  # the best of the repeats, each on its own
        fb = sum(p.fallback is not None for p in out)
        rows.append((f"parser: {name} (1 process, batch {batch_size})", n, f"{t:.2f}", f"{n / t:,.0f}",
                     f"{n_words / t:,.0f} words/s ({n_words / n:.1f} words/sentence); per CPU second: "
                     f"{n / cpu:,.0f} sentences, {n_words / cpu:,.0f} words; load {load:.1f}s, {fb} fallbacks"))
        if results is not None:
            model = getattr(backend, "model", None) or args.parser_model
            meta = getattr(getattr(backend, "nlp", None), "meta", None) or {}  # spaCy: the pipeline's own record
            if meta:
                model = f"{meta.get('lang')}_{meta.get('name')} {meta.get('version')}"
            results.append({"parser": name, "model": model, "sentences": n, "words": n_words,
                            "repeats": [{"seconds": round(a, 3), "cpu_seconds": round(b, 3)} for a, b in runs],
                            "seconds": round(t, 3), "sentences_per_s": round(n / t, 1),
                            "words_per_s": round(n_words / t, 1), "cpu_seconds": round(cpu, 3),
                            "sentences_per_cpu_s": round(n / cpu, 1), "words_per_cpu_s": round(n_words / cpu, 1),
                            "model_load_s": round(load, 2),
                            "fallbacks": fb, "batch_size": batch_size, "processes": 1,
                            "text": os.path.relpath(text, ROOT_DIR) if text else "tests/test_parsers.py ENGLISH_BPE"})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=200_000)
    p.add_argument("--parser-sentences", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="writer: best of N (default 3); with --no-writer the "
                   "parsers are timed N times too (best wall and best CPU seconds, each run in the JSON)")
    p.add_argument("--no-parsers", action="store_true")
    p.add_argument("--no-writer", action="store_true", help="parsers only")
    p.add_argument("--parsers", default="spacy,stanza", help="comma-separated (default: spacy,stanza)")
    p.add_argument("--parser-text", default=None, help="raw English text (plain or .gz) to parse instead of the "
                   "varied test sentences: its first --parser-sentences lines, Moses-tokenized")
    p.add_argument("--json", default=None, help="also write the parser measurements (and the machine) here")
    args = p.parse_args(argv)
    import logging

    import torch

    torch.set_num_threads(1)
    logging.disable(logging.INFO)
    rows, parsed = [], []
    if not args.no_writer:
        bench_writer(args.sentences, args.repeats, rows)
    if not args.no_parsers:
        bench_parsers(args.parser_sentences, rows, args.batch_size, args.parsers.split(","), args.parser_text,
                      parsed, repeats=args.repeats if args.no_writer else 1)
    if args.json:
        from benchmarks.common import write_results

        write_results({"benchmark": "benchmarks/bench_preprocess.py", "argv": sys.argv[1:] if argv is None else argv,
                       "machine": machine(), "parsers": parsed}, "", json_path=args.json)
    header = ("what", "sentences", "seconds", "sentences/s", "note")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print(" | ".join(str(x).ljust(w) for x, w in zip(r, widths)))


if __name__ == "__main__":
    main()
