"""fairseq-train words/s per architecture and precision, against stock fairseq's transformer, on one data-bin.

What a user sees in fairseq-train's log (``wps``: target tokens per second of wall time, data loading, the
update, logging and all), for short runs of every row on a corpus with realistic batches (by default the
synthetic corpus of Multi30k lengths, ``benchmarks/synthetic_corpus.py``: the toy corpus's 14 batches an epoch
hide the step in epoch overhead). Each run is ``fairseq_cli.train.main`` with fairseq-train's own command line,
``--max-update N --log-interval 5 --no-save --disable-validation``; a row's figure is the median ``wps`` of its
``train_inner`` records after the first (warm-up: CUDA context, allocator, ``--compile``'s compilation).

Rows: ``stock`` is fairseq's own transformer (pre-norm), ``--task translation`` and adam in a process that never
imports the plugin, fp32 and fairseq's own fp16 ``--amp`` (its only mixed precision); the plugin's rows run in
a second process with ``--user-dir umst_plugin --task multiscale_translation``: every arch in fp32 and under
``--amp --amp-dtype bfloat16``, plus ``transformer --use-old-adam`` in bf16 (the plugin's fast paths off: the
bf16 baseline the issue names) and, with ``--compile-archs``, rows with ``--compile``. The runs of one process
share its imports and CUDA context, so a row costs its model build and its updates.

``words/s per FLOP`` multiplies a row's words/s by its arch's matmul FLOPs per target token relative to the
transformer's (``bench_archs.matmul_flops`` on one batch of the same lengths): above 1, the arch turns FLOPs
into training faster than the transformer does.

    python -m benchmarks train --data DATA_BIN [--updates 60] [--archs umst,prime] [--json out.json]
    python -m benchmarks train --build-corpus DIR       # the synthetic corpus's data-bin, then the runs

Each process writes its rows to ``WORK/{stock,plugin}-results.json`` after every row; the same command run again
(same ``--work``) keeps the rows of the same plan done without an error and runs the rest.
"""
import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time

from benchmarks import harness

STOCK_SHARE = 0.4  # --deadline: the stock process's share (2 rows; the plugin process has the rest, 2 per arch)
DEADLINE_RESERVE = 15  # --deadline: seconds kept for the FLOP counts and the results after the processes
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PLUGIN = os.path.join(ROOT, "umst_plugin")
# not in the default rows: UMST-RPR trains as UMST does but for its relative positions (bench_archs measures it);
# the GPU check's budget for this step holds the other rows
LEFT_OUT_BY_DEFAULT = ("umst_rpr",)
PRECISION_ARGS = {"fp32": [], "bf16": ["--amp", "--amp-dtype", "bfloat16"], "fp16": ["--amp"]}


def common_args(data, arch, updates, max_tokens, seed=1):
    return [data, "--arch", arch, "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
            "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--max-tokens", str(max_tokens), "--max-update", str(updates), "--seed", str(seed),
            "--no-save", "--disable-validation", "--log-format", "json", "--log-interval", "5"]


def plan(data, archs, precisions, updates, max_tokens, compile_archs=(), compile_precisions=("bf16",), quick=False,
         loss_archs=(), loss_updates=200):
    """(stock runs, plugin runs): each a dict(name, arch, precision, argv) of fairseq-train arguments; the rows of
    ``loss_archs`` (eager and compiled) train ``loss_updates`` updates, for comparing their losses."""
    def arch_args(name):
        """(arch, its fairseq-train arguments): the row's overrides, a one-layer smoke run's sizes with ``quick``."""
        arch, overrides = harness.model_overrides(name)
        return arch, harness.overrides_to_argv(overrides) + (
            harness.overrides_to_argv(harness.quick_overrides(name, layers=1)) if quick else [])
    stock = []
    for precision in ("fp32", "fp16"):
        arch, args = arch_args("transformer")
        stock.append(dict(name="stock", arch=arch, precision=precision, compiled=False,
                          argv=common_args(data, arch, updates, max_tokens) + args
                          + ["--task", "translation"] + PRECISION_ARGS[precision]))
    plugin = []

    def add(name, precision, extra=(), compiled=False, label=None):
        arch, args = arch_args(name)
        n = loss_updates if name in loss_archs and label != "transformer_old_adam" else updates
        plugin.append(dict(name=label or name, arch=arch, precision=precision, compiled=compiled,
                           argv=common_args(data, arch, n, max_tokens) + args
                           + ["--user-dir", PLUGIN, "--task", "multiscale_translation"]
                           + PRECISION_ARGS[precision] + list(extra)))
    for name in archs:
        for precision in precisions:
            add(name, precision)
    if "transformer" in archs and "bf16" in precisions:
        add("transformer", "bf16", ["--use-old-adam"], label="transformer_old_adam")
    for name in compile_archs:
        for precision in compile_precisions:
            add(name, precision, ["--compile"], compiled=True, label=f"{name}_compile")
    return stock, plugin


def run_one(argv):
    """fairseq-train's main on ``argv`` in this process; its train_inner records and wall seconds."""
    from benchmarks import common  # (torch on first use only, as the rest of this module)

    compiling = _compile_state() if "--compile" in argv else None
    records, seconds = common.train_in_process(argv)
    if compiling is not None:
        after = _compile_state()
        records.append({"compile": {k: round(after[k] - compiling[k], 1) if k == "seconds" else
                                    after[k] - compiling[k] for k in ("seconds", "graphs", "hits", "misses")}
                        | {"eager_fallbacks": after["fallbacks"][len(compiling["fallbacks"]):]}})
    return records, seconds


def _compile_state():
    """--compile's counters in this process (umst_plugin.compilation): compile seconds, graphs, inductor / AOTAutograd
    cache hits and misses, the layer variants that fell back to eager."""
    from umst_dev.compiled_layers import eager_variants
    from umst_plugin import compilation
    from umst_plugin.compilation.telemetry import cache_counts

    hits, misses = cache_counts()
    return dict(seconds=compilation.compile_seconds(), graphs=compilation.compiled_graphs(), hits=hits, misses=misses,
                fallbacks=[f"{name}: {why}" for (name, _), why in eager_variants().items()])


def summarise(run, records, seconds):
    compiled = [r["compile"] for r in records if "compile" in r]
    records = [r for r in records if "compile" not in r]
    wps = [float(r["wps"]) for r in records]
    kept = wps[1:] if len(wps) > 1 else wps
    return dict(run, argv=run["argv"], seconds=round(seconds, 1), wps_records=wps,
                wps=statistics.median(kept) if kept else None,
                updates=int(float(records[-1]["num_updates"])) if records else 0,
                loss=[(int(float(r["num_updates"])), float(r["loss"])) for r in records if "loss" in r],
                **({"compile": compiled[0]} if compiled else {}))


def child(plan_path, out_path):
    """Run the plan's runs in this process (the stock process never imports the plugin)."""
    with open(plan_path) as f:
        runs = json.load(f)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    results = []
    for run in runs:
        print(f"[bench_train] {run['name']} {run['precision']}: fairseq-train {' '.join(run['argv'][1:4])} ...",
              file=sys.stderr, flush=True)
        stopped = False
        try:
            records, seconds = run_one(run["argv"])
            results.append(summarise(run, records, seconds))
            wps = results[-1]["wps"]
            print(f"[bench_train] {run['name']} {run['precision']}: {results[-1]['updates']} updates in "
                  f"{seconds:.0f} s, {'%.0f' % wps if wps else 'no'} words/s", file=sys.stderr, flush=True)
            if cut_short(run["argv"], results[-1]):  # fairseq-train stopped on a signal (kill, time limit)
                results[-1]["error"] = f"stopped at update {results[-1]['updates']} of {max_update(run['argv'])}"
                stopped = True
        except Exception as e:  # noqa: BLE001  (one failed row is recorded; the others run)
            results.append(dict(run, error=f"{type(e).__name__}: {e}"))
            print(f"[bench_train] {run['name']} {run['precision']}: failed: {results[-1]['error']}",
                  file=sys.stderr, flush=True)
        write_json_atomically(out_path, results)  # after every run: a process killed at a limit keeps its rows
        if stopped:
            print(f"[bench_train] {results[-1]['error']}: the remaining rows do not run (the same command resumes)",
                  file=sys.stderr, flush=True)
            return 1
    return 0


def max_update(argv):
    return int(argv[argv.index("--max-update") + 1]) if "--max-update" in argv else None


def cut_short(argv, row):
    """Whether the row trained fewer updates than its command line's --max-update."""
    return (max_update(argv) or 0) > row.get("updates", 0)


def write_json_atomically(path, value):
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def flops_per_token(names, device, quick=False):
    """Each arch's matmul FLOPs per target token on one batch of Multi30k lengths (bench_archs' batch)."""
    from umst_dev import dev

    src, tgt = harness.lengths_batch(4096)
    out = {}
    for name in names:
        _, model, task = harness.build(name, "base", quick)
        model = model.to(device).train()
        sample = dev.move_sample(harness.make_sample(task, src, tgt), device)
        out[name] = harness.matmul_flops(model, sample, "cuda" if str(device).startswith("cuda") else "cpu") \
            / int(sample["ntokens"])
    return out


def rows_done(runs, out_path):
    """The rows an earlier run of the same plan left in ``out_path`` (written after every row), in plan order and
    without an error: the same command run again resumes after them."""
    try:
        with open(out_path) as f:
            done = json.load(f)
    except (OSError, ValueError):
        return []
    kept = []
    for run, row in zip(runs, done):
        # a row cut short carries an error since child() marks it; rows written before that do not
        if row.get("argv") != run["argv"] or row.get("error") or cut_short(run["argv"], row):
            break
        kept.append(row)
    return kept


def run_process(runs, work, tag, timeout):
    plan_path, out_path = os.path.join(work, f"{tag}-plan.json"), os.path.join(work, f"{tag}-results.json")
    kept = rows_done(runs, out_path)
    if kept:
        print(f"[bench_train] {tag}: {len(kept)} of {len(runs)} rows kept from {out_path} (the same plan); running "
              "the rest", flush=True)
        if len(kept) == len(runs):
            return kept
        runs = runs[len(kept):]
        write_json_atomically(out_path, [])
    rows = _run_process(runs, plan_path, out_path, work, tag, timeout)
    if kept:
        write_json_atomically(out_path, kept + rows)  # the whole plan's rows again, for a later re-run
    return kept + rows


def relay_progress(stream, log):
    """Copy the child's output into its log, and its own ``[bench_train]`` lines (a row starts, a row ends) to
    this process's output as they come: a caller that keeps only this output (the GPU check's step log) sees
    which row was running when a limit stopped it."""
    for line in stream:
        log.write(line)
        if line.startswith("[bench_train]"):
            log.flush()
            print(line, end="", flush=True)
    log.flush()


def _run_process(runs, plan_path, out_path, work, tag, timeout):
    with open(plan_path, "w") as f:
        json.dump(runs, f)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    log_path = os.path.join(work, f"{tag}-log.txt")
    with open(log_path, "w") as log:
        # the child stays in the caller's process group: a caller that kills its group (the GPU check at a step's
        # budget) stops it too
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_train", "--child", plan_path, "--child-out",
                                 out_path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                text=True, errors="replace")
        relay = threading.Thread(target=relay_progress, args=(proc.stdout, log), daemon=True)
        relay.start()
        stopped = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()  # fairseq's data loader workers watch their parent and exit with it
            proc.wait()
            stopped = True
        relay.join(timeout=5)  # the child's last lines are in the log
        if stopped:
            print(f"[bench_train] the {tag} runs stopped at their {timeout} s limit; rows so far kept", flush=True)
            log.flush()
            with open(log_path, errors="replace") as f:  # where it was: the caller's log may be all there is
                print(f"[bench_train] the end of {log_path}:\n{f.read()[-2000:]}", flush=True)
    if not os.path.exists(out_path):
        return [dict(run, error=f"no result (see {log_path})") for run in runs]
    with open(out_path) as f:
        done = json.load(f)
    return done + [dict(run, error=f"not run (time limit; see {log_path})") for run in runs[len(done):]]


def compile_loss_comparisons(rows):
    """'arch precision' -> the eager and ``--compile`` rows' mean training loss over their last 50 common updates
    (``benchmarks.gpu_check.compare_losses``), for every arch trained both ways in one precision."""
    from benchmarks.gpu_check import compare_losses

    by = {(r["name"], r["precision"]): r for r in rows if r.get("loss")}
    compared = {}
    for (name, precision), compiled in by.items():
        eager = by.get((name[:-len("_compile")], precision)) if name.endswith("_compile") else None
        if eager is not None:
            c = compare_losses(eager["loss"], compiled["loss"])
            if c:
                a, b = dict(map(tuple, eager["loss"])), dict(map(tuple, compiled["loss"]))
                c["max_logged_rel_diff"] = max(abs(b[u] - a[u]) / a[u] for u in set(a) & set(b))  # every logged loss
                compared[f"{eager['name']} {precision}"] = c
                print(f"[bench_train] {eager['name']} {precision}: --compile against eager, mean training loss over "
                      f"updates {c['updates'][0]}-{c['updates'][1]}: {c['b']:.4f} against {c['a']:.4f}, "
                      f"{100 * c['rel_diff']:.2f}% apart (every logged loss within {100 * c['max_logged_rel_diff']:.2f}%)", flush=True)
    return compared


def ratios(rows, flops):
    stock = {r["precision"]: r for r in rows if r["name"] == "stock" and r.get("wps")}
    base = stock.get("fp32")
    for r in rows:
        if not r.get("wps") or base is None:
            continue
        r["wps_vs_stock_fp32"] = r["wps"] / base["wps"]
        name = r["name"].replace("_compile", "").replace("_old_adam", "")
        if name == "stock":
            name = "transformer"
        if flops and name in flops and "transformer" in flops:
            r["flops_per_token_ratio"] = flops[name] / flops["transformer"]
            r["wps_per_flop_vs_stock_fp32"] = r["wps_vs_stock_fp32"] * r["flops_per_token_ratio"]
    by = {(r["name"], r["precision"]): r for r in rows if r.get("wps")}
    for (name, precision), r in by.items():
        if precision != "fp32" and (name, "fp32") in by:
            r["wps_vs_own_fp32"] = r["wps"] / by[(name, "fp32")]["wps"]
    return rows


def markdown(result):
    head = ["row", "precision", "words/s", "vs stock fp32", "vs own fp32", "FLOPs/token", "words/s per FLOP vs stock",
            "updates", "run s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in result["rows"]:
        if not r.get("wps"):
            lines.append(f"| {r['name']} | {r['precision']} | {r.get('error', 'no records')} |" + " |" * 6)
            continue
        def f(key, fmt="{:.2f}"):
            return fmt.format(r[key]) if r.get(key) is not None else "-"
        lines.append(f"| {r['name']} | {r['precision']} | {r['wps']:,.0f} | {f('wps_vs_stock_fp32')} | "
                     f"{f('wps_vs_own_fp32')} | {f('flops_per_token_ratio')} | {f('wps_per_flop_vs_stock_fp32')} | "
                     f"{r['updates']} | {r['seconds']} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="a data-bin with the side files (umst-preprocess)")
    p.add_argument("--build-corpus", default=None, metavar="DIR",
                   help="build the synthetic corpus of Multi30k lengths in DIR first (benchmarks/synthetic_corpus.py)")
    p.add_argument("--archs", default=None, help="comma-separated rows (default: the transformer and every "
                                                 "family's, python -m benchmarks.harness lists them)")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--compile-archs", default="", help="also these archs with --compile (comma-separated)")
    p.add_argument("--compile-precisions", default="bf16",
                   help="the precisions of the --compile-archs rows (comma-separated; default bf16)")
    p.add_argument("--updates", type=int, default=60)
    p.add_argument("--loss-archs", default="", help="these archs' rows train --loss-updates updates (their losses "
                                                     "are compared: fp32 / bf16 / --compile)")
    p.add_argument("--loss-updates", type=int, default=200)
    p.add_argument("--markdown", default=None, help="also write the table here")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--no-stock", action="store_true", help="skip the stock process")
    p.add_argument("--timeout", type=int, default=600, help="seconds for each of the two processes")
    p.add_argument("--deadline", type=int, default=None,
                   help="seconds for the whole command (a caller's budget): the stock process gets at most "
                        f"{STOCK_SHARE:.0%}% of them, the plugin process the rest, less {DEADLINE_RESERVE} s kept "
                        "for the FLOP counts and writing the results; rows finished by then are kept")
    p.add_argument("--work", default="bench-train-work",
                   help="scratch folder (plans, per-process logs; default ./bench-train-work, not beside --json, "
                        "which is often docs/results/)")
    p.add_argument("--json", default=None)
    p.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    p.add_argument("--quick", action="store_true", help="tiny widths (1+1 layers, d 32): a smoke run")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.child_out)
    rows = harness.table()  # (after --child: the stock process must not import the plugin)
    if args.archs is None:
        args.archs = ",".join(n for n in harness.measured_rows(rows) if n not in LEFT_OUT_BY_DEFAULT)
    archs = [a for a in args.archs.split(",") if a]
    compile_archs = [a for a in args.compile_archs.split(",") if a]
    unknown = [a for a in archs + compile_archs if a not in rows]
    if unknown:
        p.error(f"unknown arch(s) {unknown}; choices: {', '.join(rows)}")
    if args.build_corpus:
        from benchmarks import synthetic_corpus

        args.data = synthetic_corpus.build(args.build_corpus)
    if not args.data and not args.dry_run:
        p.error("--data DATA_BIN or --build-corpus DIR is needed")
    stock, plugin = plan(args.data or "DATA_BIN", archs, args.precisions.split(","), args.updates, args.max_tokens,
                         compile_archs, compile_precisions=args.compile_precisions.split(","), quick=args.quick,
                         loss_archs=[a for a in args.loss_archs.split(",") if a], loss_updates=args.loss_updates)
    if args.dry_run:
        for run in stock + plugin:
            print(f"{run['name']:>22} {run['precision']}: fairseq-train {' '.join(run['argv'])}")
        return 0
    import torch

    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    start = time.time()

    def limit(share):
        """A process's seconds: --timeout, or its share of what --deadline leaves."""
        if args.deadline is None:
            return args.timeout
        left = args.deadline - DEADLINE_RESERVE - (time.time() - start)
        return max(1, int(min(args.timeout, left * share)))

    rows = [] if args.no_stock else run_process(stock, work, "stock", limit(STOCK_SHARE))
    rows += run_process(plugin, work, "plugin", limit(1.0))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    flops = flops_per_token(sorted(set(archs) | {"transformer"}), device, args.quick)
    from benchmarks import common

    result = dict(device=common.device_name(device), torch=torch.__version__, data=args.data, updates=args.updates,
                  max_tokens=args.max_tokens, flops_per_token=flops, rows=ratios(rows, flops),
                  seconds=round(time.time() - start, 1))
    compared = compile_loss_comparisons(rows)
    if compared:
        result["compile_loss"] = compared
    table = markdown(result)
    print(f"\n{result['device']}, torch {result['torch']}, {args.updates} updates of {args.max_tokens} tokens per "
          f"row\n\n{table}")
    common.write_results(result, table, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
