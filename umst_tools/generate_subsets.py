"""fairseq-generate on several subsets of one data-bin in one process (used by ``scripts/evaluate.sh --subset
test,test1,test2``).

    python -m umst_tools.generate_subsets SUBSET=RESULTS_DIR [SUBSET=RESULTS_DIR ...] -- FAIRSEQ_GENERATE_ARGS...

Runs fairseq's own ``fairseq_cli.generate.cli_main`` once per subset, with ``--gen-subset SUBSET --results-path
RESULTS_DIR`` added to the arguments: RESULTS_DIR/generate-SUBSET.txt is the file a separate fairseq-generate
process writes (each call seeds torch and numpy from ``--seed`` and loads the checkpoint itself). What it saves is
the start-up of a process per subset: importing torch and fairseq takes about 5 s of CPU (2-core Xeon, measured
with ``python -X importtime``).
"""
import logging
import os
import sys


def parse(argv):
    """([(subset, results dir), ...], fairseq-generate's arguments) from the command line."""
    if "--" not in argv:
        raise SystemExit("usage: python -m umst_tools.generate_subsets SUBSET=RESULTS_DIR [...] -- "
                         "FAIRSEQ_GENERATE_ARGS...")
    cut = argv.index("--")
    pairs, args = argv[:cut], argv[cut + 1:]
    subsets = []
    for pair in pairs:
        subset, sep, out = pair.partition("=")
        if not (sep and subset and out):
            raise SystemExit(f"generate_subsets: expected SUBSET=RESULTS_DIR, got {pair!r}")
        subsets.append((subset, out))
    if not subsets:
        raise SystemExit("generate_subsets: no SUBSET=RESULTS_DIR before --")
    for flag in ("--gen-subset", "--results-path"):
        if any(a == flag or a.startswith(flag + "=") for a in args):
            raise SystemExit(f"generate_subsets: {flag} comes from SUBSET=RESULTS_DIR, not after --")
    return subsets, args


def main(argv=None):
    subsets, args = parse(sys.argv[1:] if argv is None else argv)
    from fairseq_cli.generate import cli_main

    root = logging.getLogger()
    before = list(root.handlers)
    for subset, out in subsets:
        # each subset's logging as in a process of its own: fairseq-generate's logging.basicConfig(stream=the
        # results file) acts only on a root logger without handlers, so a handler one call added goes before the
        # next call (its file is closed by then)
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
            handler.close()
        os.makedirs(out, exist_ok=True)
        sys.argv = ["fairseq-generate", *args, "--gen-subset", subset, "--results-path", out]
        cli_main()


if __name__ == "__main__":
    main()
