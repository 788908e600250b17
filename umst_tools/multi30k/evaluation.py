"""Averaging checkpoints, decoding the test sets, scoring, and reading a run's results."""
import argparse
import os
import re
import sys


from umst_tools.multi30k.config import DATA_VARIANT, ROOT, TEST_SETS, run_dir
from umst_tools.multi30k.files import log, read_json, write_json
from umst_tools.multi30k.logs import valid_curve
from umst_tools.multi30k.machine import training_cpu_time
from umst_tools.multi30k.runs import evaluated, saved_models, sh


def models_to_average(save, n, final, found=None):
    """[(update, path), ...]: the newest ``n`` saved models up to update ``final`` (of ``found``,
    default: saved_models(save)), the last being the model of update ``final`` itself
    (checkpoint_last.pt where the budget ended on an epoch boundary and fairseq wrote no update
    checkpoint)."""
    found = saved_models(save) if found is None else found
    updates = sorted(u for u in found if u <= final)
    if not updates or updates[-1] != final:
        raise SystemExit(f"{save}: no saved model of update {final} (saved: {updates[-6:]}); "
                         "the run did not reach its budget or its checkpoints were deleted")
    if len(updates) < n:
        raise SystemExit(f"{save}: {len(updates)} saved models up to update {final}, --average {n} needs {n}")
    return [(u, found[u]) for u in updates[-n:]]


def average(args, save, n, final, output, found=None):
    """Average the newest ``n`` models up to ``final`` into ``output`` (kept: a re-run reuses it) and
    list them in OUTPUT.json."""
    if not (os.path.exists(output) and os.path.exists(output[:-3] + ".json")):  # both: a kill between
        picks = models_to_average(save, n, final, found)
        sh(args, [sys.executable, "-m", "umst_plugin.average_checkpoints", "--inputs", *[p for _, p in picks],
            "--output", output], os.path.join(save, "eval.log"))
        write_json(output[:-3] + ".json", [dict(update=u, file=os.path.basename(p)) for u, p in picks])
    return output


def undecoded(subsets, out):
    """The subsets without a results.json in ``out`` (a results directory with {subset} in it)."""
    return [s for s in subsets if not os.path.exists(os.path.join(out.replace("{subset}", s), "results.json"))]


def decode(args, row, checkpoint, subsets, out, log_file):
    """fairseq-generate (beam --beam, lenpen 1) + scripts/score.py on each of ``subsets`` not decoded before, in
    one scripts/evaluate.sh call (one process decodes them all). ``out``: the results directory, with {subset}
    in it. {subset: its results}."""
    todo = undecoded(subsets, out)
    if todo:
        cmd = ["bash", os.path.join(ROOT, "scripts/evaluate.sh"), "--data", args.data + DATA_VARIANT.get(row, ""),
               "--checkpoint", checkpoint, "--out", out, "--subset", ",".join(todo), "--beam", str(args.beam),
               "--lenpen", "1", "--no-compound-split", "--max-tokens", "4096"]
        if args.cpu:
            cmd += ["--", "--cpu"]
        sh(args, cmd, log_file)
    return {s: read_json(os.path.join(out.replace("{subset}", s), "results.json")) for s in subsets}


def evaluate(args, row, seed):
    save = run_dir(args.out, row, seed)
    if evaluated(save):  # nothing left to do (and no checkpoints needed: a run restored from --archive)
        return
    avg = average(args, save, args.average, args.max_update, os.path.join(save, f"checkpoint_avg{args.average}.pt"))
    decode(args, row, avg, [subset for subset, _ in TEST_SETS], os.path.join(save, "eval-{subset}"),
           os.path.join(save, "eval.log"))
    params = os.path.join(save, "params.json")
    if not os.path.exists(params):
        write_json(params, {"parameters": count_parameters(avg)})


def budget_curve(args, row, seed, every):
    """BLEU (valid and test_2016_flickr) of the average of the last --average models ending at every
    ``every``-th update of a run that kept all its checkpoints (--keep 0): where BLEU stops rising is the
    budget. [{"update", "valid", "test", "valid_ppl"}, ...], also in SAVE/budget-curve.json."""
    save = run_dir(args.out, row, seed)
    found = saved_models(save)
    ppl = dict(valid_curve(os.path.join(save, "train.log")))
    points = []
    for final in sorted(u for u in found if u % every == 0 and u > 0):
        try:
            models_to_average(save, args.average, final, found)
        except SystemExit:  # fewer than --average saved models so far
            continue
        subsets, out = ("valid", "test"), os.path.join(save, "curve", f"{final}-{{subset}}")
        ckpt = None
        if undecoded(subsets, out):
            ckpt = average(args, save, args.average, final,
                           os.path.join(save, "curve", f"checkpoint_avg{args.average}_{final}.pt"), found)
        point = dict(update=final, valid_ppl=ppl.get(final))
        decoded = decode(args, row, ckpt, subsets, out, os.path.join(save, "curve", "eval.log"))
        point.update((subset, results["tok_bleu"]) for subset, results in decoded.items())
        if ckpt:
            os.remove(ckpt)  # an average is as large as the model and quick to redo; its scores stay
        points.append(point)
        log(f"{row} seed {seed}: average of {args.average} ending at update {final}: valid BLEU {point['valid']}, "
            f"test BLEU {point['test']}, valid ppl {point['valid_ppl']}")
    write_json(os.path.join(save, "budget-curve.json"), points, indent=1)
    return points


def count_parameters(checkpoint):
    """Unique trainable parameters of the model a checkpoint builds (shared embeddings counted once)."""
    from fairseq import checkpoint_utils, utils

    utils.import_user_module(argparse.Namespace(user_dir=os.path.join(ROOT, "umst_plugin")))
    models, _cfg, _task = checkpoint_utils.load_model_ensemble_and_task([checkpoint])
    return sum(p.numel() for p in models[0].parameters())


def run_results(args, row, seed):
    """What one finished run measured (keys only for what exists): BLEU per test set, sacreBLEU and
    its signature, hypothesis/reference length on test, the validation perplexity curve and its last
    point (a less noisy signal than BLEU early in training), train wall time and, where recorded, CPU
    time, parameters."""
    save = run_dir(args.out, row, seed)
    out = {"row": row, "seed": seed, "bleu": {}}
    for subset, _ in TEST_SETS:
        res = os.path.join(save, f"eval-{subset}", "results.json")
        if not os.path.exists(res):
            continue
        r = read_json(res)
        out["bleu"][subset] = r["tok_bleu"]
        if subset == "test":
            m = re.search(r"ratio = ([\d.]+)", r.get("tok_bleu_detail", ""))
            if m:
                out["length_ratio"] = float(m.group(1))
            if "sacrebleu" in r:
                out["sacrebleu"] = r["sacrebleu"]
                if r.get("sacrebleu_signature"):
                    out["sacrebleu_signature"] = r["sacrebleu_signature"]
    if os.path.exists(os.path.join(save, "train-done.json")):
        done = read_json(os.path.join(save, "train-done.json"))
        out["train_wall_s"] = done["wall_s"]
        if "machine" in done:
            out["machine"] = done["machine"]
        cpu, measured = training_cpu_time(save, args.max_update)
        if cpu is not None:
            out["train_cpu_s"], out["train_cpu_measured_updates"] = round(cpu, 1), measured
        curve = [(u, ppl) for u, ppl in valid_curve(os.path.join(save, "train.log")) if u <= args.max_update]
        if curve:
            out["valid_ppl"], out["valid_curve"] = curve[-1][1], curve
    if os.path.exists(os.path.join(save, "params.json")):
        out["parameters"] = read_json(os.path.join(save, "params.json"))["parameters"]
    return out


def finished_test_decoding(args, row, seed):
    """The run's test_2016_flickr generate-test.txt once its decoding finished (results.json written last),
    else None: a running runner may still be writing it."""
    decoded = os.path.join(run_dir(args.out, row, seed), "eval-test")
    return os.path.join(decoded, "generate-test.txt") if os.path.exists(os.path.join(decoded, "results.json")) else None
