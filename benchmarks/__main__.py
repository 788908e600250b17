"""``python -m benchmarks <what> [its options]``: every benchmark from the repository root.

    python -m benchmarks archs --quick              # one training step of every arch against the transformer
    python -m benchmarks paper prime --quick        # a family's paper table (benchmarks/paper/<family>.py)
    python -m benchmarks <what> --help              # a benchmark's own options

``python -m benchmarks`` alone lists them.
"""
import importlib
import sys

# what -> (module, what it measures); the family papers' tables are ``paper <family>``
COMMANDS = {
    "archs": ("benchmarks.bench_archs", "one training step of every arch: FLOPs, saved bytes, peak memory, time"),
    "decode": ("benchmarks.bench_decode", "decoding speed (fairseq-generate) of every arch"),
    "loss": ("benchmarks.bench_loss", "the criterion's loss, fairseq's eager code against --compile's"),
    "launches": ("benchmarks.bench_launches", "kernel launches of one whole fairseq update, by phase"),
    "op-counts": ("benchmarks.bench_op_counts", "fp32-only backward matmuls under bf16, host syncs per step"),
    "matmul": ("benchmarks.bench_matmul", "fp32 vs bf16 matmul GFLOP/s: what this machine's bf16 times mean"),
    "precision": ("benchmarks.bench_precision", "fp32 vs bf16/fp16 autocast: loss, time and memory"),
    "preprocess": ("benchmarks.bench_preprocess", "parsing and side-file writing throughput"),
    "loader": ("benchmarks.bench_loader", "batches/s fairseq's data loader gives per arch, nothing trained"),
    "train": ("benchmarks.bench_train", "fairseq-train words/s, stock and plugin, eager and --compile"),
    "speed-table": ("benchmarks.speed_table", "the GPU speed table (scripts/gpu-speed.sh)"),
    "compare-runs": ("benchmarks.compare_runs", "before/after tables from two benchmark JSON files"),
    "synthetic-corpus": ("benchmarks.synthetic_corpus", "a synthetic corpus of Multi30k's or WMT14's lengths"),
}


def paper_tables():
    """The families with a paper table: ``benchmarks/paper/<family>.py``."""
    from benchmarks import paper

    return paper.tables()


def usage():
    lines = [__doc__.split("\n\n")[0], "", "benchmarks:"]
    lines += [f"  {what:<18} {about}" for what, (_, about) in COMMANDS.items()]
    lines += [f"  {'paper FAMILY':<18} a family's paper table: {', '.join(paper_tables())}"]
    return "\n".join(lines)


def module_of(argv):
    """(module name, the module's own arguments) for ``argv``; a ValueError saying what is known otherwise."""
    if not argv or argv[0] in ("-h", "--help"):
        raise ValueError(usage())
    what, rest = argv[0], argv[1:]
    if what == "paper":
        if not rest or rest[0] not in paper_tables():
            raise ValueError(f"python -m benchmarks paper FAMILY: one of {', '.join(paper_tables())}")
        return f"benchmarks.paper.{rest[0]}", rest[1:]
    if what not in COMMANDS:
        raise ValueError(f"no benchmark {what!r}\n\n{usage()}")
    return COMMANDS[what][0], rest


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        name, rest = module_of(argv)
    except ValueError as e:
        print(e, file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(name)
    sys.argv = [f"python -m benchmarks {' '.join(argv[:len(argv) - len(rest)])}"] + rest
    result = module.main()  # (each reads sys.argv: argparse's prog shows the command above)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
