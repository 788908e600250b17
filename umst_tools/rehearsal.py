"""The pieces of scripts/rehearse-wmt.sh that are not the user's own commands: the stand-in corpus, the watch on a
training job's log, and the comparison of a preempted run with an uninterrupted one.

    python -m umst_tools.rehearsal standin --multi30k DIR --raw-dir RAW [--train N --valid N --test N]
    python -m umst_tools.rehearsal wait-for-update LOG N [--timeout S]
    python -m umst_tools.rehearsal last-update SAVE_DIR
    python -m umst_tools.rehearsal compare --preempted SAVE_DIR --log LOG --reference SAVE_DIR --reference-log LOG
                                           [--json OUT]

``standin`` writes Multi30k's raw En-De text in the layout scripts/download-wmt.sh extracts WMT14 En-De to (the
files scripts/prepare-wmt14-en-de.sh reads: three training corpora as plain parallel text, newstest2013 and
newstest2014 as SGML), so that the recipe runs unchanged with ``--raw-dir RAW``. Standard library only for
``standin`` and ``wait-for-update``; ``compare`` and ``last-update`` read checkpoints with torch.
"""
import argparse
import gzip
import json
import os
import re
import sys
import time

# scripts/prepare-wmt14-en-de.sh: TRAIN_CORPORA, VALID_SGM, TEST_SGM (what the archives of
# scripts/wmt-sources.txt unpack to)
TRAIN_CORPORA = ("training/europarl-v7.de-en", "commoncrawl.de-en", "training/news-commentary-v9.de-en")
VALID_SGM = ("test/newstest2013-src.en.sgm", "test/newstest2013-src.de.sgm")
TEST_SGM = ("test-full/newstest2014-deen-src.en.sgm", "test-full/newstest2014-deen-ref.de.sgm")


def _read_gz(path, count):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for _, line in zip(range(count), f)]
    if len(lines) < count:
        raise SystemExit(f"{path}: {len(lines)} lines, {count} needed")
    return lines


def _sgm(path, setid, lang, lines, kind):
    """A WMT SGML test set: <srcset>/<refset>, one <doc>, a <seg id=N> per line; the text as it is (the recipe's
    extractor, like fairseq's prepare-wmt14en2de.sh, takes a segment's text verbatim)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tag = "srcset" if kind == "src" else "refset"
    attrs = 'srclang="any"' if kind == "src" else f'srclang="any" trglang="{lang}"'
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'<{tag} setid="{setid}" {attrs}>\n<doc sysid="{kind}" docid="multi30k-standin" genre="captions" '
                f'origlang="en">\n<p>\n')
        for i, line in enumerate(lines, 1):
            f.write(f'<seg id="{i}">{line}</seg>\n')
        f.write(f"</p>\n</doc>\n</{tag}>\n")


def write_standin(multi30k, raw_dir, n_train=3000, n_valid=100, n_test=100):
    """The first ``n_train`` Multi30k training pairs split over WMT14's three training corpora, the first
    ``n_valid`` validation pairs as newstest2013, the first ``n_test`` of test_2016_flickr as newstest2014."""
    src = {lang: _read_gz(os.path.join(multi30k, f"train.{lang}.gz"), n_train) for lang in ("en", "de")}
    third = -(-n_train // len(TRAIN_CORPORA))
    for k, prefix in enumerate(TRAIN_CORPORA):
        for lang in ("en", "de"):
            path = os.path.join(raw_dir, f"{prefix}.{lang}")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in src[lang][k * third:(k + 1) * third])
    valid = {lang: _read_gz(os.path.join(multi30k, f"val.{lang}.gz"), n_valid) for lang in ("en", "de")}
    test = {lang: _read_gz(os.path.join(multi30k, f"test_2016_flickr.{lang}.gz"), n_test) for lang in ("en", "de")}
    _sgm(os.path.join(raw_dir, VALID_SGM[0]), "newstest2013", "en", valid["en"], "src")
    _sgm(os.path.join(raw_dir, VALID_SGM[1]), "newstest2013", "de", valid["de"], "src")
    _sgm(os.path.join(raw_dir, TEST_SGM[0]), "newstest2014", "en", test["en"], "src")
    _sgm(os.path.join(raw_dir, TEST_SGM[1]), "newstest2014", "de", test["de"], "ref")
    return raw_dir


# ---- the training log ------------------------------------------------------------------------------------------

_INNER = re.compile(r"\[train_inner\].*? loss=([0-9.]+),.*? num_updates=(\d+),")


def logged_losses(log_text):
    """{update: loss} of fairseq's per-update log lines (``common.log_interval=1``); a requeued job's log holds
    both runs (``--open-mode=append``): an update logged twice keeps its last value."""
    return {int(n): float(loss) for loss, n in _INNER.findall(log_text)}


def wait_for_update(log, update, timeout=600.0):
    """Block until ``log`` shows update ``update`` (or a later one); exit 1 after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(log, encoding="utf-8", errors="replace") as f:
                seen = logged_losses(f.read())
        except FileNotFoundError:
            seen = {}
        if seen and max(seen) >= update:
            return max(seen)
        time.sleep(0.1)
    raise SystemExit(f"{log}: update {update} not logged after {timeout:.0f} s")


# ---- preempted against uninterrupted -------------------------------------------------------------------------------

def _checkpoint_state(path):
    import torch

    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    return {"num_updates": ckpt["optimizer_history"][-1]["num_updates"], "model": ckpt["model"],
            "iterations_in_epoch": ckpt["extra_state"]["train_iterator"]["iterations_in_epoch"],
            "epoch": ckpt["extra_state"]["train_iterator"]["epoch"]}


_STOP = re.compile(r"Stopping training on (SIG\w+) \(received during update (\d+).*?checkpoint_last\.pt saved at "
                   r"update (\d+), epoch (\d+) \((\d+) batches in\)")


def stops(log_text):
    """The signal stops a training log records, in order, one per update (every rank logs its own)."""
    out = []
    for name, received, saved, epoch, batches in _STOP.findall(log_text):
        stop = {"signal": name, "received_during_update": int(received), "update": int(saved), "epoch": int(epoch),
                "batches_into_epoch": int(batches)}
        if not out or out[-1]["update"] != stop["update"]:
            out.append(stop)
    return out


def last_update(save_dir):
    """The update count of SAVE_DIR/checkpoint_last.pt."""
    return _checkpoint_state(os.path.join(save_dir, "checkpoint_last.pt"))["num_updates"]


LOGGED_UNIT = 1e-3  # fairseq logs a loss to 3 decimals


def losses_apart(preempted, reference):
    """(updates whose logged losses differ by more than one logged unit, or that the preempted run did not log;
    updates one unit apart). One unit is what two equal runs can show: the 2-node run's loss of an update is
    summed over its ranks, the 1-process reference's over its update_freq batches, so the two sums may differ in
    their last float bit, and a value on a rounding boundary then logs one unit apart (measured: update 1120 of
    the WMT rehearsal, loss 6.581 against 6.582, every other figure of the update and every final weight equal)."""
    differing, one_unit = [], []
    for n in sorted(reference):
        apart = abs(preempted[n] - reference[n]) if n in preempted else float("inf")
        if apart > LOGGED_UNIT * (1 + 1e-6):
            differing.append(n)
        elif apart > 0:
            one_unit.append(n)
    return differing, one_unit


def compare(preempted_dir, preempted_log, reference_dir, reference_log):
    """The preempted-and-resumed run against the uninterrupted one: where it stopped and resumed (the log says),
    every logged loss of both (fairseq logs 3 decimals; :func:`losses_apart`), and the largest difference between the final
    checkpoints' weights (exact)."""
    with open(preempted_log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    with open(reference_log, encoding="utf-8", errors="replace") as f:
        reference = logged_losses(f.read())
    stopped = stops(text)
    ranks = len(_STOP.findall(text))
    resumed = re.findall(r"Loaded checkpoint \S*checkpoint_last\.pt \(epoch (\d+) @ (\d+) updates\)", text)
    preempted = logged_losses(text)
    mine, ref = _checkpoint_state(os.path.join(preempted_dir, "checkpoint_last.pt")), \
        _checkpoint_state(os.path.join(reference_dir, "checkpoint_last.pt"))
    worst = max((mine["model"][k].double() - ref["model"][k].double()).abs().max().item() for k in ref["model"])
    first = stopped[0]["update"] if stopped else None
    after = sorted(n for n in preempted if first is not None and n > first)
    differing, one_unit = losses_apart(preempted, reference)
    return {
        "stopped_at_update": first, "stops": len(stopped), "stop_list": stopped,
        # every rank logs a stop: one stop is one update, however many ranks
        "ranks_logging_the_stops": ranks,
        "resumed_from": [{"epoch": int(e), "num_updates": int(u)} for e, u in resumed],
        "updates": {"preempted": mine["num_updates"], "reference": ref["num_updates"]},
        "logged_updates": {"preempted": len(preempted), "reference": len(reference)},
        "logged_losses_differing": differing,
        "logged_losses_one_unit_apart": one_unit,
        "logged_losses_after_resume": {n: [preempted[n], reference.get(n)] for n in after},
        "last_logged_loss": {"preempted": preempted.get(mine["num_updates"]),
                             "reference": reference.get(ref["num_updates"])},
        "max_abs_weight_diff": worst,
    }


def agreement_problems(result, tolerance):
    """Why the preempted run does not count as the uninterrupted one (empty when it does)."""
    problems = []
    if not result["stops"] or len(result["resumed_from"]) < result["stops"]:
        problems.append(f"the run was not stopped on a signal and resumed from checkpoint_last.pt each time "
                        f"({result['stops']} stop(s), {len(result['resumed_from'])} resume(s))")
    if result["updates"]["preempted"] != result["updates"]["reference"]:
        problems.append(f"updates: {result['updates']}")
    if result["logged_updates"]["preempted"] < result["updates"]["reference"]:
        problems.append(f"not every update logged: {result['logged_updates']}")
    if result["logged_losses_differing"]:
        problems.append(f"logged losses differ at updates {result['logged_losses_differing']}")
    if result["max_abs_weight_diff"] > tolerance:
        problems.append(f"final weights up to {result['max_abs_weight_diff']} apart (tolerance {tolerance})")
    return problems


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("standin", help="the stand-in WMT14 En-De raw layout from Multi30k")
    s.add_argument("--multi30k", required=True, help="directory of Multi30k's raw *.gz files")
    s.add_argument("--raw-dir", required=True)
    s.add_argument("--train", type=int, default=3000)
    s.add_argument("--valid", type=int, default=100)
    s.add_argument("--test", type=int, default=100)
    w = sub.add_parser("wait-for-update", help="block until a training log shows an update")
    w.add_argument("log")
    w.add_argument("update", type=int)
    w.add_argument("--timeout", type=float, default=600.0)
    u = sub.add_parser("last-update", help="the update count of SAVE_DIR/checkpoint_last.pt")
    u.add_argument("save_dir")
    c = sub.add_parser("compare", help="a preempted run against an uninterrupted one")
    c.add_argument("--preempted", required=True)
    c.add_argument("--log", required=True)
    c.add_argument("--reference", required=True)
    c.add_argument("--reference-log", required=True)
    c.add_argument("--json")
    c.add_argument("--tolerance", type=float, default=None,
                   help="exit 1 unless the run stopped and resumed, every logged loss is equal (or one logged unit "
                        "apart: losses_apart), both runs made the "
                        "same number of updates, and every final weight agrees within this")
    args = p.parse_args(argv)
    if args.command == "standin":
        write_standin(args.multi30k, args.raw_dir, args.train, args.valid, args.test)
        print(f"stand-in WMT14 En-De raw files in {args.raw_dir}: {args.train} training, {args.valid} newstest2013, "
              f"{args.test} newstest2014 pairs from {args.multi30k}")
    elif args.command == "wait-for-update":
        print(wait_for_update(args.log, args.update, args.timeout))
    elif args.command == "last-update":
        print(last_update(args.save_dir))
    else:
        result = compare(args.preempted, args.log, args.reference, args.reference_log)
        text = json.dumps(result, indent=1)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text + "\n")
        print(text)
        if args.tolerance is not None:
            problems = agreement_problems(result, args.tolerance)
            for problem in problems:
                print(f"compare: {problem}", file=sys.stderr)
            return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
