"""Run several fairseq-train command lines in one process and record each run's training losses exactly.

    python tests/train_driver.py SPEC.json OUT.json

SPEC.json: ``[{"name": ..., "argv": [fairseq-train arguments]}, ...]``, run in order, each as ``fairseq-train``
runs it (``fairseq_cli.train.cli_main`` with that command line); an argument ``glob:PATTERN`` is the one file
that matches PATTERN when the run starts (a checkpoint an earlier run of the list wrote). A process that never passes ``--user-dir`` never
imports the plugin: stock fairseq. OUT.json: ``{name: {"losses": [loss / sample_size of each training forward
pass, in order], "error": null or the exception's last line}}``. The losses are read from the criterion's
return value (fairseq's log rounds them to 3 decimals); validation is expected to be off.
"""
import glob
import json
import os
import sys
import time
import traceback


def record_losses(sink):
    """Wrap fairseq's label-smoothed cross-entropy criterion: every forward pass in training mode appends its loss
    per target token to ``sink`` (a list the caller swaps per run)."""
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    forward = LabelSmoothedCrossEntropyCriterion.forward

    def recording_forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = forward(self, model, sample, reduce)
        if model.training:
            sink[-1].append(float(loss.detach().float()) / float(sample_size))
        return loss, sample_size, logging_output

    LabelSmoothedCrossEntropyCriterion.forward = recording_forward


def resolve(arg):
    if not arg.startswith("glob:"):
        return arg
    found = glob.glob(arg[len("glob:"):])
    if len(found) != 1:
        raise FileNotFoundError(f"{arg}: expected one file, found {found}")
    return found[0]


def main(spec_path, out_path):
    import torch

    torch.set_num_threads(1)
    from fairseq_cli import train

    with open(spec_path) as f:
        spec = json.load(f)
    sink = [[]]
    record_losses(sink)
    results = {}
    for run in spec:
        sink.append([])
        error = None
        start = time.time()
        try:
            sys.argv = ["fairseq-train", *map(resolve, run["argv"])]
            train.cli_main()
        except BaseException as e:  # a run that dies is a result (its message), not the end of the others
            error = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()[-1]
            print(traceback.format_exc(), file=sys.stderr)
        results[run["name"]] = {"losses": sink[-1], "error": error, "seconds": round(time.time() - start, 2)}
        print(f"[train_driver] {run['name']}: {len(sink[-1])} losses, error={error}", file=sys.stderr, flush=True)
    with open(out_path + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(out_path + ".tmp", out_path)


if __name__ == "__main__":
    main(*sys.argv[1:])
