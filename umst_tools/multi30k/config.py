"""The rows, seeds, test sets and constants of the Multi30k comparison, and the command-line value types."""
import argparse
import os
import re


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


CONFIGS = os.path.join(ROOT, "configs")


ROWS = ["m30k-transformer", "m30k-transformer-prenorm", "m30k-umst", "m30k-transformer-sf", "m30k-msc",
        "m30k-msmsa", "m30k-prime", "m30k-prime-simple", "m30k-umst-noparse", "m30k-umst-random-phrase"]


LABELS = {
    "m30k-transformer": "Transformer-tiny (post-norm)", "m30k-transformer-prenorm": "Transformer-tiny (pre-norm)",
    "m30k-umst": "UMST", "m30k-transformer-sf": "TranSFormer", "m30k-msc": "MSC", "m30k-msmsa": "MSMSA",
    "m30k-prime": "Prime", "m30k-prime-simple": "Prime-simple",
    "m30k-umst-noparse": "UMST, `--parser none` (no phrase edges)",
    "m30k-umst-random-phrase": "UMST, `--phrase-adjacency-noise random`",
}


DATA_VARIANT = {"m30k-umst-noparse": "_noparse"}


TEST_SETS = [("test", "2016 Flickr"), ("test1", "2017 Flickr"), ("test2", "2017 MSCOCO")]


REFERENCE = {"m30k-transformer": 41.02}  # Wu et al. 2021 (Revisit-MMT), tokenized BLEU, test_2016_flickr


BASELINE = "m30k-transformer-prenorm"  # what --significance compares every other row with, seed by seed


ABLATIONS = ["m30k-umst-noparse", "m30k-umst-random-phrase"]  # UMST's parse ablation: never --close-seeds


# Pairs the table also compares directly with --significance (first row minus second, same seed): UMST
# against its parse ablations (UMST table 8) and Prime against Prime without its convolution branch.
COMPARE = "m30k-umst:m30k-umst-noparse,m30k-umst:m30k-umst-random-phrase,m30k-prime:m30k-prime-simple"


SEGMENT_HEADER = "# started "  # train.log: one header per training segment (a resumed run has several)


CPU_TIME = "cpu-time.json"  # {a segment's "# started" time: CPU seconds of its training process}


SAMPLE_IDS = [0, 1, 2, 3, 4]


def markers(block=""):
    """The docs markers the table is written between: ``multi30k-table`` or ``multi30k-table:BLOCK``."""
    name = "multi30k-table" + (f":{block}" if block else "")
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


MARK_BEGIN, MARK_END = markers()


def run_dir(out, row, seed):
    return os.path.join(out, row, f"seed{seed}")


def warmup_updates(max_update, fixed=None):
    """``fixed`` (--warmup) if given, else the reference's 2,000 warm-up updates of 8,000, compressed in
    proportion for shorter runs."""
    if fixed is not None:
        return fixed
    return max(1, round(2000 * min(max_update, 8000) / 8000))


def compare_pairs(value):
    """--compare: comma-separated ROW:ROW pairs of known rows ('' for none)."""
    pairs = []
    for item in filter(None, value.split(",")):
        pair = tuple(item.split(":"))
        if len(pair) != 2 or pair[0] == pair[1] or not set(pair) <= set(ROWS):
            raise argparse.ArgumentTypeError(f"expected ROW:ROW of two different rows of {', '.join(ROWS)}, got {item!r}")
        pairs.append(pair)
    return pairs


LR_OVERRIDE = re.compile(r"\+?optimization\.lr=\[?([^\]]+)\]?")


def lr_of(args):
    """The peak learning rate of the table: the last ``optimization.lr=[x]`` override, or the configs' 5e-3."""
    lr = "5e-3 (the configs')"
    for o in args.override:
        m = LR_OVERRIDE.fullmatch(o)
        if m:
            lr = m.group(1)
    return lr


def precision_of(args):
    """The training precision the table and its picture name: fp16, bf16 or fp32."""
    return "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"


def save_every(value):
    """--save-every: a positive number of updates, or 'epoch'."""
    if value == "epoch":
        return value
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of updates or 'epoch', got {value!r}")
    return int(value)
