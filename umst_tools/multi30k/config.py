"""The rows, seeds, test sets and constants of the Multi30k comparison, and the command-line value types."""
import argparse
import os
import re

import yaml  # PyYAML, a dependency of omegaconf (fairseq's config)


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


CONFIGS = os.path.join(ROOT, "configs")


TABLE = os.path.join(CONFIGS, "tables", "multi30k.yaml")  # the rows, labels, baseline and pairs of the table


def _table():
    with open(TABLE, encoding="utf-8") as f:
        return yaml.safe_load(f)


_TABLE = _table()
ROWS = list(_TABLE["rows"])
LABELS = dict(_TABLE["rows"])
DATA_VARIANT = dict(_TABLE["data_variant"])
TEST_SETS = [("test", "2016 Flickr"), ("test1", "2017 Flickr"), ("test2", "2017 MSCOCO")]
REFERENCE = dict(_TABLE["reference"])
BASELINE = _TABLE["baseline"]  # what --significance compares every other row with, seed by seed
ABLATIONS = list(_TABLE["ablations"])  # never --close-seeds
COMPARE = _TABLE["compare"]  # pairs --significance also compares directly (first minus second, same seed)


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
