"""``umst-average-checkpoints``: average the parameters of fairseq checkpoints.

fairseq's own ``scripts/average_checkpoints.py`` is not part of the pip package,
and every paper here evaluates an average (MSC: last 5 epoch checkpoints for
base, 20 for big; Prime/DynamicConv: last 10)::

    umst-average-checkpoints --inputs checkpoints/umst-t2-umst-base --num-epoch-checkpoints 5 \\
        --output checkpoints/umst-t2-umst-base/checkpoint_avg5.pt
    umst-average-checkpoints --inputs DIR --num-update-checkpoints 10 --checkpoint-upper-bound 300000 ...
    umst-average-checkpoints --inputs a.pt b.pt c.pt --output avg.pt

The result is a normal checkpoint (the newest input's cfg, args and extra state,
with averaged ``model`` weights and no optimizer state) that fairseq-generate loads.
Parameters are summed in float64 and cast back to each tensor's own dtype.
"""
import argparse
import collections
import os
import re
import sys

import torch

import umst_plugin  # noqa: F401  (allow-lists fairseq checkpoint classes for torch.load)

EPOCH_PATTERN = re.compile(r"^checkpoint(\d+)\.pt$")
UPDATE_PATTERN = re.compile(r"^checkpoint_\d+_(\d+)\.pt$")


def last_n_checkpoints(directory, n, update_based=False, upper_bound=None):
    """Paths of the newest ``n`` epoch (checkpointE.pt) or update (checkpoint_E_U.pt) checkpoints."""
    pattern = UPDATE_PATTERN if update_based else EPOCH_PATTERN
    found = []
    for name in os.listdir(directory):
        m = pattern.match(name)
        if m:
            number = int(m.group(1))
            if upper_bound is None or number <= upper_bound:
                found.append((number, os.path.join(directory, name)))
    kind = "update" if update_based else "epoch"
    if len(found) < n:
        raise ValueError(f"found {len(found)} {kind} checkpoints in {directory}"
                         f"{'' if upper_bound is None else f' at or below {upper_bound}'}, need {n}")
    found.sort(reverse=True)
    return [path for _, path in found[:n]]


def load(path):
    with open(path, "rb") as f:
        return torch.load(f, map_location="cpu")


def updates_of(state):
    """The updates a fairseq checkpoint was trained for (its optimizer history); -1 where it records none."""
    history = state.get("optimizer_history") or [{}]
    return history[-1].get("num_updates", -1)


def average_checkpoints(paths):
    """A checkpoint dict whose ``model`` is the mean of the inputs' models (same keys required)."""
    if not paths:
        raise ValueError("no checkpoints to average")
    sums, dtypes, newest, keys = collections.OrderedDict(), {}, None, None
    for path in paths:
        state = load(path)
        model = state["model"]
        if newest is None or updates_of(state) > updates_of(newest):
            # the average carries the newest input's cfg, optimizer history and training state, in whatever
            # order the inputs come (the multi30k runner lists them oldest first)
            newest = {k: v for k, v in state.items() if k != "model"}
        if keys is None:
            keys = list(model.keys())
        elif set(model.keys()) != set(keys):
            missing = set(keys) ^ set(model.keys())
            raise ValueError(f"{path} has different parameters than {paths[0]}: {sorted(missing)[:5]}")
        for k, v in model.items():
            if not torch.is_tensor(v):
                continue
            if k not in sums:
                sums[k] = v.detach().to(torch.float64).clone() if v.is_floating_point() else v.clone()
                dtypes[k] = v.dtype
            elif v.is_floating_point():
                sums[k].add_(v.detach().to(torch.float64))
            elif not torch.equal(sums[k], v):  # integer buffers (e.g. step counters) must agree
                raise ValueError(f"integer tensor {k} differs between checkpoints; cannot average it")
        del state
    averaged = collections.OrderedDict()
    for k in keys:
        if k in sums:
            v = sums[k]
            averaged[k] = (v / len(paths)).to(dtypes[k]) if v.is_floating_point() else v
    out = dict(newest)
    out["model"] = averaged
    out["last_optimizer_state"] = None  # not meaningful for an average; keeps the file small
    out["averaged_from"] = [os.path.basename(p) for p in paths]
    return out


def get_parser():
    p = argparse.ArgumentParser(prog="umst-average-checkpoints",
                                description="Average the model weights of fairseq checkpoints.")
    p.add_argument("--inputs", nargs="+", required=True,
                   help="checkpoint files, or one directory with --num-epoch-checkpoints/--num-update-checkpoints")
    p.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--num-epoch-checkpoints", type=int, help="average the last N checkpointE.pt of the directory")
    g.add_argument("--num-update-checkpoints", type=int,
                   help="average the last N checkpoint_E_U.pt of the directory (--save-interval-updates)")
    p.add_argument("--checkpoint-upper-bound", type=int,
                   help="ignore checkpoints after this epoch (or update, with --num-update-checkpoints)")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    n = args.num_epoch_checkpoints if args.num_epoch_checkpoints is not None else args.num_update_checkpoints
    if n is not None:
        flag = "--num-epoch-checkpoints" if args.num_epoch_checkpoints is not None else "--num-update-checkpoints"
        if n < 1:
            print(f"umst-average-checkpoints: error: {flag} {n}: expected at least 1 checkpoint", file=sys.stderr)
            return 2
        if len(args.inputs) != 1:
            print(f"umst-average-checkpoints: error: {flag} needs exactly one directory in --inputs (the run's "
                  f"save dir), got {len(args.inputs)}: {' '.join(args.inputs)}", file=sys.stderr)
            return 2
        if not os.path.isdir(args.inputs[0]):
            what = "is a file, not a directory" if os.path.exists(args.inputs[0]) else "does not exist"
            print(f"umst-average-checkpoints: error: --inputs {args.inputs[0]} {what} ({flag} reads the checkpoints "
                  f"of a run's save dir)", file=sys.stderr)
            return 2
        try:
            paths = last_n_checkpoints(args.inputs[0], n, args.num_update_checkpoints is not None,
                                       args.checkpoint_upper_bound)
        except ValueError as e:
            print(f"umst-average-checkpoints: error: {e}", file=sys.stderr)
            return 2
    else:
        paths = args.inputs
        bad = [p for p in paths if not os.path.isfile(p)]
        if bad:
            print(f"umst-average-checkpoints: error: not a file: {bad[0]} (give files, or a directory with "
                  "--num-epoch-checkpoints/--num-update-checkpoints)", file=sys.stderr)
            return 2
    print("averaging " + ", ".join(os.path.basename(p) for p in paths), file=sys.stderr)
    state = average_checkpoints(paths)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    tmp = args.output + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, args.output)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
