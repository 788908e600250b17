#!/usr/bin/env python3
"""Train every Multi30k row (several seeds), average, decode the three test sets, write the table.

    python scripts/multi30k_table.py --data data/multi30k_en_de/data-bin/multi30k_en_de_bpe10000
    python scripts/multi30k_table.py --data DATA_BIN --max-update 600 --jobs 2 --threads 1   # CPU budget
    python scripts/multi30k_table.py --data DATA_BIN --jobs 10 --fp16                        # one GPU

For each row of configs/m30k-*.yaml and each seed: fairseq-hydra-train with the row's config
(``--max-update`` below the reference 8,000 compresses the warm-up in proportion: warm-up =
max-update / 4, the reference's 2,000 of 8,000), umst-average-checkpoints over the last
``--average`` checkpoints (saved every ``--save-every`` updates, about an epoch), fairseq-generate with beam 5 / lenpen 1 on test (2016 Flickr),
test1 (2017 Flickr) and test2 (2017 MSCOCO), scored by scripts/score.py: tokenized BLEU
(multi-bleu style, no compound splitting, as the published 41.02) and detokenized sacreBLEU
with its signature. Runs are resumable: a finished step is not redone (delete its files to redo).
Writes OUT/table.md, OUT/runs.json (every run's numbers per seed, and the budget) and
OUT/valid-ppl.png (validation perplexity against updates, every run); with
--docs FILE also the table between the markers ``<!-- multi30k-table:begin -->`` /
``<!-- multi30k-table:end -->`` of FILE, or with --docs-block NAME between
``<!-- multi30k-table:NAME:begin -->`` / ``...:NAME:end -->`` (tables of several budgets on one page).
The UMST "no parse" row reads DATA_BIN_noparse (written by prepare-multi30k.sh).
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import score  # noqa: E402  (scripts/score.py: reads fairseq-generate output as evaluate.sh scores it)
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
SAMPLE_IDS = [0, 1, 2, 3, 4]


def markers(block=""):
    """The docs markers the table is written between: ``multi30k-table`` or ``multi30k-table:BLOCK``."""
    name = "multi30k-table" + (f":{block}" if block else "")
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


MARK_BEGIN, MARK_END = markers()


def log(msg):
    print(f"[multi30k {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_dir(out, row, seed):
    return os.path.join(out, row, f"seed{seed}")


def warmup_updates(max_update):
    """The reference's 2,000 warm-up updates of 8,000, compressed in proportion for shorter runs."""
    return max(1, round(2000 * min(max_update, 8000) / 8000))


def train_cmd(args, row, seed, save):
    warmup = warmup_updates(args.max_update)
    cmd = [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", CONFIGS, "--config-name", row,
           f"task.data={args.data + DATA_VARIANT.get(row, '')}", f"common.user_dir={ROOT}/umst_plugin",
           f"checkpoint.save_dir={save}", f"hydra.run.dir={save}", f"common.seed={seed}",
           f"optimization.max_update={args.max_update}", f"lr_scheduler.warmup_updates={warmup}",
           f"dataset.max_tokens={args.max_tokens}", "common.log_interval=25", "dataset.num_workers=0",
           # update checkpoints about one epoch apart (29,000 captions ~ 53 batches of 8,192 tokens), so
           # the average covers the last --average "epochs" including the final updates
           "checkpoint.no_epoch_checkpoints=true", f"checkpoint.save_interval_updates={args.save_every}",
           f"checkpoint.keep_interval_updates={args.average}"]
    if args.cpu:
        cmd += ["common.cpu=true"]
    if args.fp16:
        cmd += ["common.fp16=true"]
    if args.bf16:
        cmd += ["common.bf16=true"]
    return cmd + args.override


def last_update(train_log):
    """(updates done, last train loss) read from a fairseq log, or (0, None)."""
    if not os.path.exists(train_log):
        return 0, None
    upd, loss = 0, None
    with open(train_log, errors="replace") as f:
        for line in f:
            m = re.search(r"num_updates=(\d+)", line) or re.search(r"\| num_updates (\d+)", line)
            if m:
                upd = max(upd, int(m.group(1)))
            m = re.search(r"\bloss=([\d.]+)", line)
            if m:
                loss = float(m.group(1))
    return upd, loss


def valid_curve(train_log):
    """[(update, validation perplexity), ...] of a fairseq log, in order (one point per update count)."""
    points = {}
    if os.path.exists(train_log):
        with open(train_log, errors="replace") as f:
            for line in f:
                if "valid on" in line:
                    ppl, upd = re.search(r"\| ppl ([\d.]+)", line), re.search(r"\| num_updates (\d+)", line)
                    if ppl and upd:
                        points[int(upd.group(1))] = float(ppl.group(1))
    return sorted(points.items())


def plot_valid_curves(args, rows, seeds, results, path):
    """Validation perplexity against updates, one line per run (colour: row, line style: seed)."""
    try:
        import matplotlib
    except ImportError:  # an optional extra (pip install -e .[inspect]); the table does not need it
        log("matplotlib is not installed: no valid-ppl.png (pip install matplotlib)")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = plt.get_cmap("tab10")
    styles = ["-", "--", ":", "-."]
    drawn = False
    for i, row in enumerate(rows):
        for j, seed in enumerate(seeds):
            curve = results[row, seed].get("valid_curve")
            if curve:
                ax.plot(*zip(*curve), color=colours(i % 10), linestyle=styles[j % len(styles)], marker=".",
                        label=f"{LABELS[row].split(' (`')[0]}" + (f" seed {seed}" if len(seeds) > 1 else ""))
                drawn = True
    if not drawn:
        plt.close(fig)
        return False
    ax.set_yscale("log")
    ax.set_xlabel("update")
    ax.set_ylabel("validation perplexity (log scale)")
    ax.set_title(f"Multi30k En-De valid, {args.max_update} updates of {args.max_tokens} tokens")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def trained(save, max_update):
    stamp = os.path.join(save, "train-done.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            return json.load(f).get("max_update") == max_update
    return False


def train_all(args, runs):
    """Train the runs, --jobs at a time, printing every job's progress every --status-every seconds;
    a finished training is averaged and decoded right away (in its freed slot), so results land as
    they come."""
    pending = [r for r in runs if not trained(run_dir(args.out, *r), args.max_update)]
    for r in runs:
        if r not in pending:
            log(f"{r[0]} seed {r[1]}: trained before")
            log(f"{r[0]} seed {r[1]}: average + decode test sets")
            evaluate(args, *r)
    active = {}
    env = dict(os.environ)
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"  # fairseq logs to stdout: unbuffered, so the progress lines are current
    last_status = time.time()
    failed = []
    while pending or active:
        while pending and len(active) < args.jobs:
            row, seed = pending.pop(0)
            save = run_dir(args.out, row, seed)
            os.makedirs(save, exist_ok=True)
            logf = open(os.path.join(save, "train.log"), "a")
            cmd = train_cmd(args, row, seed, save)
            logf.write("# " + " ".join(cmd) + "\n")
            logf.flush()
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            active[(row, seed)] = (proc, time.time(), logf)
            log(f"{row} seed {seed}: training started (log {save}/train.log)")
        time.sleep(2)
        for key, (proc, start, logf) in list(active.items()):
            if proc.poll() is None:
                continue
            logf.close()
            del active[key]
            save = run_dir(args.out, *key)
            upd, loss = last_update(os.path.join(save, "train.log"))
            wall = time.time() - start
            if proc.returncode != 0 or upd < args.max_update:
                failed.append(key)
                with open(os.path.join(save, "train.log"), errors="replace") as f:
                    tail = "".join(f.readlines()[-15:])
                log(f"{key[0]} seed {key[1]}: FAILED (exit {proc.returncode}, {upd} updates); see {save}/train.log:\n"
                    + tail)
                continue
            with open(os.path.join(save, "train-done.json"), "w") as f:
                json.dump(dict(max_update=args.max_update, wall_s=round(wall, 1), jobs=args.jobs,
                               threads=args.threads, loss=loss), f)
            log(f"{key[0]} seed {key[1]}: trained {upd} updates in {wall:.0f} s (last train loss {loss}); "
                "average + decode test sets")
            evaluate(args, *key)
            log(f"{key[0]} seed {key[1]}: " + ", ".join(
                f"{subset} BLEU {read_json(os.path.join(save, f'eval-{subset}', 'results.json'))['tok_bleu']}"
                for subset, _ in TEST_SETS))
        if active and time.time() - last_status >= args.status_every:
            last_status = time.time()
            parts = []
            for (row, seed), (proc, start, _) in active.items():
                upd, loss = last_update(os.path.join(run_dir(args.out, row, seed), "train.log"))
                parts.append(f"{row}/s{seed} {upd}/{args.max_update} loss {loss} ({time.time() - start:.0f}s)")
            log("training: " + "; ".join(parts) + (f"; {len(pending)} waiting" if pending else ""))
    return failed


def sh(cmd, logfile):
    env = dict(os.environ, PYTHON=sys.executable)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    with open(logfile, "a") as f:
        f.write("# " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if rc != 0:
        raise SystemExit(f"failed ({rc}): {' '.join(cmd)}; see {logfile}")


def evaluate(args, row, seed):
    save = run_dir(args.out, row, seed)
    avg = os.path.join(save, f"checkpoint_avg{args.average}.pt")
    if not os.path.exists(avg):
        sh([sys.executable, "-m", "umst_plugin.average_checkpoints", "--inputs", save,
            "--num-update-checkpoints", str(args.average), "--output", avg], os.path.join(save, "eval.log"))
    data = args.data + DATA_VARIANT.get(row, "")
    for subset, _ in TEST_SETS:
        out = os.path.join(save, f"eval-{subset}")
        if os.path.exists(os.path.join(out, "results.json")):
            continue
        cmd = ["bash", os.path.join(ROOT, "scripts/evaluate.sh"), "--data", data, "--checkpoint", avg, "--out", out,
               "--subset", subset, "--beam", str(args.beam), "--lenpen", "1", "--no-compound-split",
               "--max-tokens", "4096"]
        if args.cpu:
            cmd += ["--", "--cpu"]
        sh(cmd, os.path.join(save, "eval.log"))
    params = os.path.join(save, "params.json")
    if not os.path.exists(params):
        with open(params, "w") as f:
            json.dump({"parameters": count_parameters(avg)}, f)


def count_parameters(checkpoint):
    """Unique trainable parameters of the model a checkpoint builds (shared embeddings counted once)."""
    from fairseq import checkpoint_utils, utils

    utils.import_user_module(argparse.Namespace(user_dir=os.path.join(ROOT, "umst_plugin")))
    models, _cfg, _task = checkpoint_utils.load_model_ensemble_and_task([checkpoint])
    return sum(p.numel() for p in models[0].parameters())


def read_json(path):
    with open(path) as f:
        return json.load(f)


def mean_spread(values):
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def run_results(args, row, seed):
    """What one finished run measured (keys only for what exists): BLEU per test set, sacreBLEU and
    its signature, hypothesis/reference length on test, the validation perplexity curve and its last
    point (a less noisy signal than BLEU early in training), train wall time, parameters."""
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
        out["train_wall_s"] = read_json(os.path.join(save, "train-done.json"))["wall_s"]
        curve = valid_curve(os.path.join(save, "train.log"))
        if curve:
            out["valid_ppl"], out["valid_curve"] = curve[-1][1], curve
    if os.path.exists(os.path.join(save, "params.json")):
        out["parameters"] = read_json(os.path.join(save, "params.json"))["parameters"]
    return out


def table(args, rows, seeds, results):
    lines = []
    sig = None
    hw = args.hardware or f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores"
    lines += [f"Budget: {args.max_update} updates of {args.max_tokens} tokens per row and seed "
              f"(reference: 8,000 x 8,192), warm-up {warmup_updates(args.max_update)}, "
              f"seeds {','.join(map(str, seeds))}, {'fp16' if args.fp16 else 'bf16' if args.bf16 else 'fp32'}, "
              f"{args.jobs} training job(s) at a time"
              f"{f' with {args.threads} thread(s) each' if args.threads else ''}; hardware: {hw}. "
              f"{'Overrides: `' + ' '.join(args.override) + '`. ' if args.override else ''}"
              f"Average of the last {args.average} checkpoints ({args.save_every} updates apart), beam 5, lenpen 1. "
              "BLEU: tokenized (multi-bleu style on the lowercased Moses-tokenized text, no compound splitting), "
              "mean ± standard deviation over seeds.", ""]
    head = ("| row | params | " + " | ".join(f"{name} BLEU" for _, name in TEST_SETS)
            + " | 2016 Flickr sacreBLEU | hyp/ref length | valid ppl | train wall time / run | published |")
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    samples = {}
    for row in rows:
        runs = [results[row, seed] for seed in seeds]
        per_set = {s: [r["bleu"][s] for r in runs if s in r["bleu"]] for s, _ in TEST_SETS}
        sacre = [r["sacrebleu"] for r in runs if "sacrebleu" in r]
        ratios = [r["length_ratio"] for r in runs if "length_ratio" in r]
        walls = [r["train_wall_s"] for r in runs if "train_wall_s" in r]
        ppls = [r["valid_ppl"] for r in runs if "valid_ppl" in r]
        params = next((r["parameters"] for r in runs if "parameters" in r), None)
        sig = next((r["sacrebleu_signature"] for r in runs if "sacrebleu_signature" in r), sig)
        for seed in seeds:
            gen = os.path.join(run_dir(args.out, row, seed), "eval-test", "generate-test.txt")
            if row not in samples and os.path.exists(gen):
                samples[row] = dict(enumerate(score.read_generate(gen)[0]))
        n = len(per_set["test"])
        cells = [LABELS[row] + f" (`{row}`)", f"{params / 1e6:.2f}M" if params else "–"]
        cells += [mean_spread(per_set[s]) for s, _ in TEST_SETS]
        cells += [mean_spread(sacre), mean_spread(ratios), mean_spread(ppls), f"{statistics.mean(walls) / 60:.1f} min" if walls else "–",
                  f"{REFERENCE[row]} (8,000 updates, 2 GPUs)" if row in REFERENCE else ""]
        if n != len(seeds):
            cells[0] += f" ({n} of {len(seeds)} seeds)"
        lines.append("| " + " | ".join(cells) + " |")
    if sig:
        lines += ["", f"sacreBLEU signature: `{sig}`"]
    src = os.path.join(args.data, "..", "..", "tok", "test.en")  # as the model read it (tokenized, cased as the recipe)
    ref = os.path.join(args.data, "ref", "test.tok.de")
    if samples and os.path.exists(ref):
        srcs = open(src, encoding="utf-8").read().splitlines() if os.path.exists(src) else []
        refs = open(ref, encoding="utf-8").read().splitlines()
        lines += ["", "Five test_2016_flickr sentences (seed of the first finished run; BPE removed, tokenized):", ""]
        for i in SAMPLE_IDS:
            lines += [f"**{i}.** source: {srcs[i] if i < len(srcs) else '?'}  ", f"reference: {refs[i]}  "]
            for row in rows:
                if row in samples and i in samples[row]:
                    lines.append(f"{LABELS[row]}: {samples[row][i]}  ")
            lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="the data-bin of prepare-multi30k.sh")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows (default: all)")
    p.add_argument("--seeds", default="1,2", help="comma-separated seeds (default: 1,2)")
    p.add_argument("--max-update", type=int, default=8000, help="updates per run (reference: 8000)")
    p.add_argument("--max-tokens", type=int, default=8192, help="tokens per update (reference: 8192)")
    p.add_argument("--average", type=int, default=5,
                   help="average the last N update checkpoints, --save-every apart (default: 5)")
    p.add_argument("--save-every", type=int, default=50,
                   help="updates between checkpoints (default: 50, about one epoch at 8,192 tokens)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--jobs", type=int, default=1, help="trainings at a time (several fit on one GPU)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads per training (OMP/MKL; 0 = torch's default)")
    p.add_argument("--cpu", action="store_true", help="train and decode on the CPU")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--out", default="runs/multi30k", help="where runs go (default: runs/multi30k)")
    p.add_argument("--docs", help="also write the table between the multi30k-table markers of this file")
    p.add_argument("--docs-block", default="",
                   help="write between the multi30k-table:NAME markers instead (a second table on the same page)")
    p.add_argument("--hardware", help="hardware named in the table (default: CPU model and core count)")
    p.add_argument("--status-every", type=float, default=30.0, help="seconds between progress lines")
    p.add_argument("--table-only", action="store_true", help="only (re)write the table from finished runs")
    p.add_argument("override", nargs="*", help="extra hydra overrides for every training, e.g. common.log_interval=10")
    args = p.parse_args(argv)
    args.data = os.path.abspath(args.data.rstrip("/"))
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; rows: {', '.join(ROWS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.max_update % args.save_every:
        p.error(f"--max-update {args.max_update} must be a multiple of --save-every {args.save_every} "
                "(the last checkpoint must hold the final update)")
    for r in rows:
        data = args.data + DATA_VARIANT.get(r, "")
        if not os.path.isdir(data):
            p.error(f"row {r} needs the data-bin {data} (run scripts/prepare-multi30k.sh)")
    args.out = os.path.abspath(args.out)
    if not args.table_only:
        runs = [(r, s) for s in seeds for r in rows]  # seed-major: every row gets one seed first
        log(f"{len(runs)} runs: {len(rows)} rows x seeds {seeds}, {args.max_update} updates each, "
            f"{args.jobs} at a time; output {args.out}")
        failed = train_all(args, runs)
        if failed:
            log(f"failed runs: {failed}")
    results = {(r, s): run_results(args, r, s) for s in seeds for r in rows}  # read every run once
    text = table(args, rows, seeds, results)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text)
    if plot_valid_curves(args, rows, seeds, results, os.path.join(args.out, "valid-ppl.png")):
        log(f"validation curves: {os.path.join(args.out, 'valid-ppl.png')}")
    with open(os.path.join(args.out, "runs.json"), "w", encoding="utf-8") as f:  # every run, per seed
        budget = {k: getattr(args, k) for k in ("max_update", "max_tokens", "average", "save_every", "beam", "jobs",
                                                "threads", "cpu", "fp16", "bf16", "override", "hardware")}
        json.dump({"budget": dict(budget, warmup_updates=warmup_updates(args.max_update)),
                   "runs": list(results.values())}, f, indent=1)
    if args.docs:
        begin, end = markers(args.docs_block)
        doc = open(args.docs, encoding="utf-8").read()
        if begin not in doc or end not in doc:
            raise SystemExit(f"{args.docs}: no {begin} ... {end} markers to write the table between")
        head, rest = doc.split(begin, 1)
        _, tail = rest.split(end, 1)
        with open(args.docs, "w", encoding="utf-8") as f:
            f.write(head + begin + "\n" + text + end + tail)
    print(text)
    log(f"table: {os.path.join(args.out, 'table.md')}")
    return 1 if not args.table_only and failed else 0


if __name__ == "__main__":
    sys.exit(main())
