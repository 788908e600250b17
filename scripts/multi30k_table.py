#!/usr/bin/env python3
"""Train every Multi30k row (several seeds), average, decode the three test sets, write the table.

    python scripts/multi30k_table.py --data data/multi30k_en_de/data-bin/multi30k_en_de_bpe10000
    python scripts/multi30k_table.py --data DATA_BIN --max-update 600 --jobs 2 --threads 1   # CPU budget
    python scripts/multi30k_table.py --data DATA_BIN --jobs 10 --fp16                        # one GPU

For each row of configs/m30k-*.yaml and each seed: fairseq-hydra-train with the row's config
(``--max-update`` below the reference 8,000 compresses the warm-up in proportion: warm-up =
max-update / 4, the reference's 2,000 of 8,000), umst-average-checkpoints over the last
``--average`` checkpoints (saved every ``--save-every`` updates, about an epoch), fairseq-generate with
beam 5 / lenpen 1 on test (2016 Flickr),
test1 (2017 Flickr) and test2 (2017 MSCOCO), scored by scripts/score.py: tokenized BLEU
(multi-bleu style, no compound splitting, as the published 41.02) and detokenized sacreBLEU
with its signature. Runs are resumable: a finished step is not redone (delete its files to redo).
Writes OUT/table.md, OUT/runs.json (every run's numbers per seed, and the budget) and
OUT/valid-ppl.png (validation perplexity against updates, every run; beside it the second half, linear;
captioned with the command, budget, seeds, precision and machines); with
--docs FILE also the table between the markers ``<!-- multi30k-table:begin -->`` /
``<!-- multi30k-table:end -->`` of FILE, or with --docs-block NAME between
``<!-- multi30k-table:NAME:begin -->`` / ``...:NAME:end -->`` (tables of several budgets on one page).
The UMST "no parse" row reads DATA_BIN_noparse (written by prepare-multi30k.sh). ``--redraw
FILE[:KEY]`` draws a table's picture again from its runs.json alone (no runs, checkpoints or data).

Checkpoints: every ``--save-every`` updates, or at every epoch end with ``--save-every epoch`` (the
reference's "last 5 epoch checkpoints"). The averaged checkpoints always end at the final model: where
the budget ends on an epoch boundary fairseq writes no update checkpoint there, only checkpoint_last.pt,
and that file is then the last of the average (OUT/ROW/seedS/averaged.json lists what was averaged).

Runs survive the machine: a training killed at any moment (kill -9, machine gone) resumes from its
checkpoint_last.pt when the runner is re-run, losing only the updates since that checkpoint (a
checkpoint that the kill cut short, in the middle of fairseq's non-atomic copy to checkpoint_last.pt, is
removed and checkpoint_last.pt rebuilt from the newest whole one: repair_checkpoints); its log
(train.log, appended, one ``# started ...`` header per segment) is read whole, and its training time is
the time per update over all segments times the budget (redone updates and restarts are not counted
twice). On the CPU the table gives CPU time (user + system of the training process, recorded per segment
in OUT/ROW/seedS/cpu-time.json): with one intra-op thread per training it is the work done whatever else
runs on the machine, where wall time grows with every other job beside it. A training of the runner
dies with the runner (a re-run never meets an orphan writing the same
checkpoints); a re-run while another runner trains the same run stops with an error.

Runs also survive losing the machine itself with ``--archive DIR`` (a folder under version control):
every finished run's logs, scores and hypotheses, without checkpoints, are copied to DIR/ROW/seedS, and a
runner on a fresh machine takes the runs it finds there (same budget and settings) as trained and
decoded, so the table needs only the runs the archive lacks (a run in progress is lost with its machine).

With ``--significance`` each row is compared with the pre-norm transformer of the same seed by sacreBLEU's
paired bootstrap resampling (1,000 samples, tokenized BLEU on test_2016_flickr): the table shows the
difference and its p value per seed.
"""
import argparse
import ctypes
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import time
import zipfile

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


def log(msg):
    print(f"[multi30k {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_dir(out, row, seed):
    return os.path.join(out, row, f"seed{seed}")


def warmup_updates(max_update, fixed=None):
    """``fixed`` (--warmup) if given, else the reference's 2,000 warm-up updates of 8,000, compressed in
    proportion for shorter runs."""
    if fixed is not None:
        return fixed
    return max(1, round(2000 * min(max_update, 8000) / 8000))


def checkpoint_overrides(save_every, keep):
    """Where fairseq saves: every ``save_every`` updates, or at every epoch end ("epoch"); the newest
    ``keep`` kept (0: all, for a budget curve)."""
    keep = -1 if keep == 0 else keep
    if save_every == "epoch":
        return ["checkpoint.no_epoch_checkpoints=false", "checkpoint.save_interval_updates=0",
                f"checkpoint.keep_last_epochs={keep}"]
    return ["checkpoint.no_epoch_checkpoints=true", f"checkpoint.save_interval_updates={save_every}",
            f"checkpoint.keep_interval_updates={keep}"]


# glibc serves an allocation over its mmap threshold (at most 32 MB) with a fresh mmap and unmaps it on free,
# so every training step's largest tensors (the output layer's logits and their gradient: about 1,750 target
# tokens x 10,000 types x 4 bytes = 70 MB) are new pages the kernel must fault in and zero, ~70,000 minor
# faults per step. Measured on this project's 2-core CPU (d 128, one thread): a quarter of a training's CPU
# time was system time, and a logits-sized forward/backward ran 875 ms -> 453 ms per step with mmap off.
# Allocation only: the arithmetic, hence every number, is unchanged.
REUSE_FREED_MEMORY = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def subprocess_env(args, **extra):
    """The environment of the runner's trainings and decodings: ROOT on PYTHONPATH, --threads, and on the
    CPU (--malloc reuse) glibc malloc told to keep freed memory for reuse instead of unmapping it."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    if args.cpu and args.malloc == "reuse":
        for key, value in REUSE_FREED_MEMORY.items():
            env.setdefault(key, value)
    return env


def train_cmd(args, row, seed, save):
    warmup = warmup_updates(args.max_update, args.warmup)
    cmd = [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", CONFIGS, "--config-name", row,
           f"task.data={args.data + DATA_VARIANT.get(row, '')}", f"common.user_dir={ROOT}/umst_plugin",
           f"checkpoint.save_dir={save}", f"hydra.run.dir={save}", f"common.seed={seed}",
           f"optimization.max_update={args.max_update}", f"lr_scheduler.warmup_updates={warmup}",
           f"dataset.max_tokens={args.max_tokens}", "common.log_interval=25", "dataset.num_workers=0"]
    cmd += checkpoint_overrides(args.save_every, args.keep if args.keep is not None else args.average)
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
            upd = max(upd, logged_update(line) or 0)
            line_loss = logged_loss(line)
            loss = loss if line_loss is None else line_loss
    return upd, loss


def logged_update(line):
    """The update count a fairseq log line reports (train_inner's ``num_updates=U``, an epoch summary's
    ``| num_updates U``), or None."""
    m = re.search(r"num_updates=(\d+)", line) or re.search(r"\| num_updates (\d+)", line)
    return int(m.group(1)) if m else None


def logged_loss(line):
    """The train loss a fairseq train_inner line reports (``loss=L``), or None."""
    m = re.search(r"\bloss=([\d.]+)", line)
    return float(m.group(1)) if m else None


LOG_TIME = re.compile(r"^\[?(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)")


def training_segments(train_log):
    """[{"start", "end" (seconds since the epoch), "from_update", "to_update", "loss", "points"}, ...]: one
    entry per training process that wrote to the log (the runner heads each with ``# ...``; a resumed
    process starts from the update of the checkpoint it loaded, which fairseq logs as ``(epoch E @ U
    updates)``); ``loss`` is the last train loss that process logged (None before its first); ``points``
    the (time, update) of each of its timed lines that reports an update, for a recent pace."""
    segments = []
    if not os.path.exists(train_log):
        return segments
    with open(train_log, errors="replace") as f:
        for line in f:
            if line.startswith("# "):
                m = re.match(r"# started (\S+)", line)
                start = datetime.datetime.fromisoformat(m.group(1)).timestamp() if m else None
                segments.append(dict(start=start, end=start, from_update=0, to_update=0, loss=None, points=[],
                                     started=m.group(1) if m else None))
                continue
            if not segments:
                segments.append(dict(start=None, end=None, from_update=0, to_update=0, loss=None, points=[]))
            seg = segments[-1]
            m = LOG_TIME.match(line)
            t = datetime.datetime.fromisoformat(m.group(1).replace("T", " ")).timestamp() if m else None
            if t is not None:
                seg["start"] = t if seg["start"] is None else seg["start"]
                seg["end"] = t
            m = re.search(r"Loaded checkpoint .*\(epoch \d+ @ (\d+) updates", line)
            if m:
                seg["from_update"] = seg["to_update"] = int(m.group(1))
            update = logged_update(line)
            if update is not None and t is not None:
                seg["points"].append((t, update))
            seg["to_update"] = max(seg["to_update"], update or 0)
            line_loss = logged_loss(line)
            seg["loss"] = seg["loss"] if line_loss is None else line_loss
    return [s for s in segments if s["start"] is not None]


def training_time(train_log, max_update):
    """Seconds of training for ``max_update`` updates: time per update over every segment of the log
    (validation and checkpoint saving included) times the budget, so that the updates a killed
    segment did after its last checkpoint, redone by the next, are not counted twice. None without
    any timed update."""
    seconds, _ = scaled_to_budget([(s, s["end"] - s["start"]) for s in training_segments(train_log)], max_update)
    return seconds


def scaled_to_budget(timed_segments, max_update):
    """(seconds per update over [(segment, its seconds), ...] times ``max_update``, updates measured over);
    (None, 0) without any update done."""
    done = sum(s["to_update"] - s["from_update"] for s, _ in timed_segments)
    if done <= 0:
        return None, 0
    return sum(t for _, t in timed_segments) / done * max_update, done


def process_cpu_seconds(pid):
    """User + system CPU seconds of a live process so far (Linux /proc), None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state is field 3
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15
    except (OSError, IndexError, ValueError):
        return None


def reap(proc):
    """(exit code, CPU seconds) of a finished training process, (None, CPU seconds so far) of a running
    one: os.wait4 gives a finished child's exact user + system time."""
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    if pid == 0:
        return None, process_cpu_seconds(proc.pid)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def record_cpu_time(save, started, seconds):
    """Store a training segment's CPU seconds in SAVE/cpu-time.json (atomically: a kill leaves the old file)."""
    if seconds is None:
        return
    path = os.path.join(save, CPU_TIME)
    cpu = read_json(path) if os.path.exists(path) else {}
    cpu[started] = round(seconds, 1)
    write_json(path, cpu, indent=1)


def training_cpu_time(save, max_update):
    """(CPU seconds of training ``max_update`` updates, updates it was measured over): CPU time per update
    over the segments whose CPU time the runner recorded, times the budget, as training_time() does with
    wall time; (None, 0) where none was recorded (a run logged before the runner recorded CPU time)."""
    path = os.path.join(save, CPU_TIME)
    cpu = read_json(path) if os.path.exists(path) else {}
    return scaled_to_budget([(s, cpu[s["started"]]) for s in training_segments(os.path.join(save, "train.log"))
                             if s.get("started") in cpu], max_update)


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


def pyplot(picture):
    """matplotlib.pyplot on the file-only Agg backend, or None (logged: no PICTURE) where matplotlib is not
    installed: an optional extra (pip install -e .[inspect]) that the table itself does not need."""
    try:
        import matplotlib
    except ImportError:
        log(f"matplotlib is not installed: no {picture} (pip install matplotlib)")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plain_label(row):
    """A row's label in a picture: the table's, without its config name and markdown code marks."""
    return LABELS[row].split(" (`")[0].replace("`", "")


def caption(args, seeds, seeds_note, hardware, width_in):
    """The lines under a picture of the runner's, wrapped to a figure ``width_in`` inches wide: a picture
    travels without its table, so it names its command (with the hydra overrides but the learning rate's,
    which the budget names), budget, seeds (with what tells them apart in it), precision and hardware."""
    chars = int(width_in * 72 / 4.2)  # characters of 7-point text per line, with a margin
    settings = "".join(f" {o}" for o in args.override if not LR_OVERRIDE.fullmatch(o))  # what else the runs set
    return "\n".join(textwrap.fill(line, chars) for line in (
        f"scripts/multi30k_table.py{settings}: {args.max_update} updates of {args.max_tokens} tokens, "
        f"lr {lr_of(args)}, "
        f"warm-up {warmup_updates(args.max_update, args.warmup)}, {precision_of(args)}, "
        f"seeds {','.join(map(str, seeds))} {seeds_note};", f"hardware: {hardware}"))


def caption_height(text):
    """Inches a caption() of 7-point lines takes under a figure."""
    return 0.2 * (text.count("\n") + 1)


def hardware_of(args, results, runs, default=None):
    """The hardware a picture of RUNS ((row, seed) pairs) names: --hardware first, as in the table; else
    the machines those runs recorded; else ``default``, or this machine."""
    machines = list(dict.fromkeys(results[run]["machine"] for run in runs if "machine" in results.get(run, {})))
    return args.hardware or " and ".join(machines) or default or this_machine()


def valid_curves_figure(args, rows, seeds_of, results):
    """Validation perplexity against updates, one line per run (colour: row, line style: seed): the whole
    run on a log scale, and beside it the second half of training on a linear scale, where runs near
    convergence differ by a few tenths of perplexity that the log scale flattens into one line. A
    matplotlib figure, or None where no run has a validation point (or matplotlib is missing)."""
    plt = pyplot("valid-ppl.png")
    if plt is None:
        return None
    curves = [(i, row, seed, results[row, seed]["valid_curve"]) for i, row in enumerate(rows)
              for seed in seeds_of[row] if results[row, seed].get("valid_curve")]
    if not curves:
        return None
    styles, style_names = ["-", "--", ":", "-."], ["solid", "dashed", "dotted", "dash-dot"]
    all_seeds = sorted({s for row in rows for s in seeds_of[row]})
    seeds_text = ", ".join(f"{s} {style_names[i % len(styles)]}" for i, s in enumerate(all_seeds))
    width = 12
    text = caption(args, all_seeds, f"({seeds_text})",
                   hardware_of(args, results, [(row, seed) for _, row, seed, _ in curves]), width)
    ncol = 4
    legend_rows = -(-len(curves) // ncol)
    caption_h = caption_height(text)  # inches, under the legend
    legend_h = 0.2 * legend_rows + 0.15 + caption_h  # inches: legend rows of 7-point text, a margin, the caption
    height = 4.5 + legend_h
    fig, (whole, late) = plt.subplots(1, 2, figsize=(width, height))
    colours = plt.get_cmap("tab10")
    fig.text(0.5, 0.08 / height, text, ha="center", va="bottom", fontsize=7)
    half = args.max_update / 2
    for i, row, seed, curve in curves:
        style = dict(color=colours(i % 10), linestyle=styles[all_seeds.index(seed) % len(styles)])
        whole.plot(*zip(*curve), marker=".", label=plain_label(row)
                   + (f" seed {seed}" if len(all_seeds) > 1 else ""), **style)
        tail = [(u, ppl) for u, ppl in curve if u >= half]
        if tail:
            late.plot(*zip(*tail), marker=".", **style)
    whole.set_yscale("log")
    whole.set_ylabel("validation perplexity (log scale)")
    whole.set_title(f"Multi30k En-De valid, {args.max_update} updates of {args.max_tokens} tokens")
    # below both panels: inside the left one it hid the curves' first thousand updates
    fig.legend(*whole.get_legend_handles_labels(), loc="lower center", ncol=ncol, fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, caption_h / height))
    late.set_xlim(left=half)
    late.set_ylabel("validation perplexity")
    late.set_title(f"second half ({half:g}-{args.max_update} updates), linear scale")
    for ax in (whole, late):
        ax.set_xlabel("update")
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout(rect=(0, legend_h / height, 1, 1))
    return fig


def plot_valid_curves(args, rows, seeds_of, results, path):
    """valid_curves_figure() saved as PATH; False where there was nothing to draw."""
    fig = valid_curves_figure(args, rows, seeds_of, results)
    if fig is None:
        return False
    fig.savefig(path, dpi=80)
    pyplot("valid-ppl.png").close(fig)
    return True


def budget_curves_figure(args, curves, hardware):
    """BLEU of the averaged model against the update it ends at (valid solid, test dashed), per run, with
    the caption of valid_curves_figure; a matplotlib figure, or None where matplotlib is missing."""
    plt = pyplot("bleu-curve.png")
    if plt is None:
        return None
    width = 8
    text = caption(args, sorted({seed for _, seed in curves}), "(valid solid, test dashed)", hardware, width)
    caption_h = caption_height(text)  # inches, under the plot
    height = 4.5 + caption_h
    fig, ax = plt.subplots(figsize=(width, height))
    colours = plt.get_cmap("tab10")
    for i, ((row, seed), points) in enumerate(sorted(curves.items())):
        if points:
            ups = [p["update"] for p in points]
            name = f"{plain_label(row)} seed {seed}"
            ax.plot(ups, [p["valid"] for p in points], color=colours(i % 10), marker=".", label=f"{name}, valid")
            ax.plot(ups, [p["test"] for p in points], color=colours(i % 10), linestyle="--", marker=".",
                    label=f"{name}, test 2016 Flickr")
    if any(row in REFERENCE for row, _ in curves):
        ax.axhline(REFERENCE["m30k-transformer"], color="grey", linestyle=":", linewidth=1,
                   label=f"published post-norm, test 2016 Flickr ({REFERENCE['m30k-transformer']}, 8,000 x 8,192 tokens)")
    ax.set_xlabel("update (the average of the last checkpoints ends here)")
    ax.set_ylabel("tokenized BLEU")
    ax.set_title(f"Multi30k En-De: BLEU of the average of the last {args.average} checkpoints, "
                 f"{args.max_tokens} tokens per update")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.text(0.5, 0.08 / height, text, ha="center", va="bottom", fontsize=7)
    fig.tight_layout(rect=(0, caption_h / height, 1, 1))
    return fig


def plot_budget_curves(args, curves, path, hardware):
    """budget_curves_figure() saved as PATH; False where matplotlib is missing."""
    fig = budget_curves_figure(args, curves, hardware)
    if fig is None:
        return False
    fig.savefig(path, dpi=80)
    pyplot("bleu-curve.png").close(fig)
    log(f"BLEU curves: {path}")
    return True


def redraw(args):
    """--redraw FILE[:KEY]: draw the picture of a table again from what its runner wrote, without its runs
    (a table whose runs and checkpoints are gone; a picture of an older runner, drawn before pictures were
    captioned): a runs.json (``budget`` and ``runs``) gives OUT/valid-ppl.png, a budget-curve record
    (``budget``, ``row``, ``seed``, ``averaged_bleu_curve``) OUT/bleu-curve.png. Budget, precision and
    hardware come from the file (--hardware overrides it); KEY picks one record of a file that holds several."""
    path, _, key = args.redraw.partition(":")
    record = read_json(path)
    if key:
        if key not in record:
            raise SystemExit(f"{path}: no record {key!r} to redraw; it holds {', '.join(map(repr, record))}")
        record = record[key]
    kinds = "a runs.json ('budget', 'runs') or a budget-curve record ('budget', 'row', 'seed', 'averaged_bleu_curve')"
    if "budget" not in record or not ("runs" in record or "averaged_bleu_curve" in record):
        several = [k for k, v in record.items() if isinstance(v, dict) and "budget" in v]
        raise SystemExit(f"{path}: expected {kinds}, found the keys {', '.join(map(repr, record))}"
                         + (f"; pick a record with {path}:KEY, KEY one of {', '.join(several)}" if several else ""))
    budget = record["budget"]
    names = ("max_update", "max_tokens", "average", "fp16", "bf16", "override", "warmup_updates")
    missing = [name for name in names if name not in budget]
    if missing:
        raise SystemExit(f"{path}: its budget lacks {', '.join(missing)} (a runs.json of the runner has them all)")
    for name in names[:-1]:
        setattr(args, name, budget[name])
    args.warmup = budget["warmup_updates"]
    # as the table named it: --hardware, else the table's own --hardware, else the machines its runs recorded
    args.hardware = args.hardware or budget.get("hardware") or record.get("hardware")
    os.makedirs(args.out, exist_ok=True)
    if "runs" in record:
        results = {(run["row"], run["seed"]): run for run in record["runs"]}
        rows = list(dict.fromkeys(row for row, _ in results))
        seeds_of = {row: [seed for r, seed in results if r == row] for row in rows}
        args.hardware = hardware_of(args, results, list(results), default="not recorded")
        picture = os.path.join(args.out, "valid-ppl.png")
        drawn = plot_valid_curves(args, rows, seeds_of, results, picture)
    else:
        picture = os.path.join(args.out, "bleu-curve.png")
        drawn = plot_budget_curves(args, {(record["row"], record["seed"]): record["averaged_bleu_curve"]}, picture,
                                   args.hardware or "not recorded")
    if drawn:
        log(f"redrawn from {args.redraw}: {picture}")
    return 0 if drawn else 1


def this_machine():
    """The CPU this runner trains on, as /proc/cpuinfo names it, with its vector extensions and core
    count: CPU times are comparable only between runs of the same machine (a later session may get
    another). Falls back to the platform module off Linux."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields:
        name += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    flags = set(fields.get("flags", "").split())
    vector = next((v for f, v in (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2")) if f in flags), None)
    return f"{name}{', ' + vector if vector else ''}, {os.cpu_count()} cores"


def trained(save, max_update):
    stamp = os.path.join(save, "train-done.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            return json.load(f).get("max_update") == max_update
    return False


def die_with_parent():
    """In the training's process, before exec: be killed when the runner dies (Linux PR_SET_PDEATHSIG),
    so that a killed runner never leaves a training that a re-run would meet writing the same files."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:  # not Linux: an orphan may go on; the lock file still stops a second runner
        pass


def claim(save):
    """Take the run directory for this runner (SAVE/runner.pid); stop if a live runner holds it."""
    lock = os.path.join(save, "runner.pid")
    if os.path.exists(lock):
        with open(lock) as f:
            pid = int(f.read().strip() or 0)
        alive = pid > 0 and pid != os.getpid() and os.path.exists(f"/proc/{pid}")
        if alive:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                alive = b"multi30k_table" in f.read()
        if alive:
            raise SystemExit(f"{save}: another runner (pid {pid}) is training this run; wait for it or kill it")
    with open(lock, "w") as f:
        f.write(str(os.getpid()))


def whole_checkpoint(path):
    """Whether a checkpoint file was written to its end: torch.save writes a zip archive whose central
    directory comes last, so a file cut short does not open as one."""
    try:
        with zipfile.ZipFile(path):
            return True
    except (zipfile.BadZipFile, OSError):
        return False


def repair_checkpoints(save):
    """Undo what a kill in the middle of fairseq's checkpoint save leaves, before the training resumes.

    fairseq writes a save's first file atomically (FILE.tmp, then rename) but *copies* it to the save's
    other names (checkpoint_E_U.pt, checkpoint_best.pt, checkpoint_last.pt). A kill during a copy leaves a
    truncated file: fairseq's next start dies on a truncated checkpoint_last.pt (EOFError), starts again
    from scratch if it is missing, and a truncated update checkpoint would break the average. Every
    truncated checkpoint is deleted (its whole original is on disk: the file it was copied from), so is a
    leftover FILE.tmp, and a missing or truncated checkpoint_last.pt is rebuilt (copy, then rename) from
    the newest whole checkpoint, which is the model fairseq was saving. Returns what it did, one line each."""
    done = []
    names = sorted(os.listdir(save))
    for name in names:
        path = os.path.join(save, name)
        if name.startswith("checkpoint") and name.endswith(".pt.tmp"):
            os.remove(path)
            done.append(f"removed {name} (a save cut short)")
        elif name.startswith("checkpoint") and name.endswith(".pt") and not whole_checkpoint(path):
            size = os.path.getsize(path)
            os.remove(path)
            done.append(f"removed {name} (truncated at {size:,} bytes: a copy cut short)")
    last = os.path.join(save, "checkpoint_last.pt")
    if not os.path.exists(last):
        found = saved_models(save)  # checkpoint_last.pt is not among them: it is missing
        if found:
            newest = found[max(found)]
            copy_file(newest, last)
            done.append(f"checkpoint_last.pt rebuilt from {os.path.basename(newest)} (update {max(found)})")
    return done


def forget_results(save):
    """Remove what an earlier budget of this run measured (its average, scores and stamp)."""
    for name in os.listdir(save):
        if name.startswith(("checkpoint_avg", "eval-")) or name == "train-done.json":
            path = os.path.join(save, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)


# Overrides naming where a run's files are: the same training elsewhere (another clone, another --out)
RUN_LOCATION = ("checkpoint.save_dir=", "hydra.run.dir=", "common.user_dir=")


def settings(cmd, portable=False):
    """The hydra overrides of a training command that decide its model (all but the budget and how many
    checkpoints are kept), as a set; ``portable``: without where the run and the plugin were, and the
    data-bin by its name only (an archived run trained on another machine)."""
    args = cmd.split() if isinstance(cmd, str) else cmd
    args = args[args.index("fairseq_cli.hydra_train") + 1:] if "fairseq_cli.hydra_train" in args else args
    out = {a for a in args if not a.startswith(("optimization.max_update=", "checkpoint.keep_"))}
    if portable:
        out = {f"task.data={os.path.basename(a.split('=', 1)[1])}" if a.startswith("task.data=") else a
               for a in out if not a.startswith(RUN_LOCATION)}
    return out


def check_same_settings(args, row, seed, what, where=None, portable=False, option="--out"):
    """Stop unless every training segment logged in the train.log of ``where`` (default: the run's
    directory; an archived copy with ``portable`` settings) ran with this command's settings."""
    save = run_dir(args.out, row, seed)
    where = where or save
    train_log = os.path.join(where, "train.log")
    if not os.path.exists(train_log):
        return
    with open(train_log, errors="replace") as f:
        headers = [line[2:].split(": ", 1)[-1] for line in f if line.startswith("# ")]
    want = settings(train_cmd(args, row, seed, save), portable)
    for header in headers:
        if settings(header, portable) != want:
            raise SystemExit(f"{where} {what} with other settings: {sorted(settings(header, portable) ^ want)}; "
                             f"use another {option}")


def adopt_longer_run(args, row, seed):
    """A run already trained past --max-update with the same settings (a budget-finding run, --keep 0)
    answers for the shorter budget: with the inverse-sqrt schedule and fixed --warmup, fairseq's
    per-update seeds and per-epoch shuffling, its model of update N is the N-update run's model. Stamp it
    trained; evaluate() averages its saved models up to --max-update. Stops if its settings differ."""
    save = run_dir(args.out, row, seed)
    train_log = os.path.join(save, "train.log")
    trained_to = last_update(train_log)[0]
    if trained(save, args.max_update) or trained_to <= args.max_update:
        return
    check_same_settings(args, row, seed, f"trained past --max-update {args.max_update}")
    forget_results(save)
    write_json(os.path.join(save, "train-done.json"),
               dict(max_update=args.max_update, wall_s=round(training_time(train_log, args.max_update), 1),
                    trained_to=trained_to, jobs=args.jobs, threads=args.threads))
    log(f"{row} seed {seed}: trained to update {trained_to} before; its first {args.max_update} "
        "updates are this budget's run")


def archived_files(save, average_n):
    """The files of a finished run, relative to its directory, that the table reads (no checkpoints)."""
    names = ["train.log", "train-done.json", CPU_TIME, "params.json", f"checkpoint_avg{average_n}.json"]
    for subset, _ in TEST_SETS:
        names += [os.path.join(f"eval-{subset}", n) for n in ("results.json", f"generate-{subset}.txt", "hyp.detok.txt")]
    return [n for n in names if os.path.exists(os.path.join(save, n))]


def evaluated(save):
    """Every test set decoded and the parameters counted: nothing of evaluate() is left to do."""
    return os.path.exists(os.path.join(save, "params.json")) and all(
        os.path.exists(os.path.join(save, f"eval-{subset}", "results.json")) for subset, _ in TEST_SETS)


def archive_run(args, row, seed):
    """Copy what the table reads of a finished, decoded run (logs, scores, hypotheses; no checkpoint) to
    ARCHIVE/ROW/seedS, where a later runner on a fresh machine finds it (restore_run). Of a decoding's
    generate file only what the table reads is kept: the hypotheses and targets (``H-``, ``T-``) and the
    BLEU line, not the sources, detokenized hypotheses (hyp.detok.txt has them) and per-token scores
    (``S-``, ``D-``, ``P-``: two thirds of the file). Every file is written atomically and results.json
    goes last, so an archive cut off mid-copy is not taken for a finished one and is copied again."""
    save, dest = run_dir(args.out, row, seed), run_dir(args.archive, row, seed)
    if not evaluated(save) or (evaluated(dest) and read_json(os.path.join(dest, "train-done.json"))
                               == read_json(os.path.join(save, "train-done.json"))):
        return  # not finished, or archived before
    names = sorted(archived_files(save, args.average), key=lambda n: n.endswith("results.json"))
    for name in names:  # an older archive of this run (a longer budget) is not finished until the new one is
        if name.endswith("results.json") and os.path.exists(os.path.join(dest, name)):
            os.remove(os.path.join(dest, name))
    for name in names:
        os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
        if os.path.basename(name).startswith("generate-"):  # not hyp.detok.txt: a cased "S-Bahn ..." stays
            with open(os.path.join(save, name), encoding="utf-8") as f:
                write_file(os.path.join(dest, name), "".join(x for x in f if not x.startswith(("S-", "D-", "P-"))))
        else:
            copy_file(os.path.join(save, name), os.path.join(dest, name))
    log(f"{row} seed {seed}: archived to {dest}")


def restore_run(args, row, seed):
    """A run of this budget and settings that ARCHIVE holds and OUT does not (a fresh machine, another
    --out): copy it into OUT, where it counts as trained and decoded. False if there is nothing to
    restore; stops if the archived run trained with other settings."""
    save, src = run_dir(args.out, row, seed), run_dir(args.archive, row, seed)
    if not evaluated(src) or os.path.exists(os.path.join(save, "train-done.json")):
        return False
    if read_json(os.path.join(src, "train-done.json")).get("max_update") != args.max_update:
        return False
    check_same_settings(args, row, seed, "was trained", where=src, portable=True, option="--archive")
    # train-done.json last: until it is there the run is not restored, and a re-run restores it again
    for name in sorted(archived_files(src, args.average), key=lambda n: n == "train-done.json"):
        os.makedirs(os.path.dirname(os.path.join(save, name)), exist_ok=True)
        copy_file(os.path.join(src, name), os.path.join(save, name))
    log(f"{row} seed {seed}: restored from {src} (trained and decoded before)")
    return True


def train_all(args, runs):
    """Train the runs, --jobs at a time, printing every job's progress every --status-every seconds;
    a finished training is averaged and decoded right away (in its freed slot), so results land as
    they come."""
    for r in runs:
        adopt_longer_run(args, *r)
    pending = [r for r in runs if not trained(run_dir(args.out, *r), args.max_update)]
    for r in runs:
        if r not in pending:
            log(f"{r[0]} seed {r[1]}: trained before")
            log(f"{r[0]} seed {r[1]}: average + decode test sets")
            evaluate(args, *r)
            if args.archive:
                archive_run(args, *r)
    active = {}
    env = subprocess_env(args)
    env["PYTHONUNBUFFERED"] = "1"  # fairseq logs to stdout: unbuffered, so the progress lines are current
    last_status = time.time()
    failed = []
    while pending or active:
        while pending and len(active) < args.jobs:
            row, seed = pending.pop(0)
            save = run_dir(args.out, row, seed)
            os.makedirs(save, exist_ok=True)
            claim(save)
            for repaired in repair_checkpoints(save):
                log(f"{row} seed {seed}: {repaired}")
            resumed = os.path.exists(os.path.join(save, "checkpoint_last.pt"))
            if resumed:  # continue only the same training (a longer budget is the same training)
                check_same_settings(args, row, seed, "was trained")
            forget_results(save)
            logf = open(os.path.join(save, "train.log"), "a")
            cmd = train_cmd(args, row, seed, save)
            started = datetime.datetime.now().isoformat(timespec='seconds')
            logf.write(f"{SEGMENT_HEADER}{started} runner pid {os.getpid()}: " + " ".join(cmd) + "\n")
            logf.flush()
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    preexec_fn=die_with_parent)
            active[(row, seed)] = (proc, time.time(), logf, started)
            log(f"{row} seed {seed}: training {'resumed from checkpoint_last.pt' if resumed else 'started'} "
                f"(log {save}/train.log)")
        time.sleep(2)
        status_due = time.time() - last_status >= args.status_every
        for key, (proc, start, logf, started) in list(active.items()):
            save = run_dir(args.out, *key)
            returncode, cpu = reap(proc)
            if returncode is None:
                if status_due:  # what a killed runner leaves: the CPU time up to its last progress line
                    record_cpu_time(save, started, cpu)
                continue
            record_cpu_time(save, started, cpu)
            logf.close()
            del active[key]
            upd, loss = last_update(os.path.join(save, "train.log"))
            wall = training_time(os.path.join(save, "train.log"), args.max_update) or time.time() - start
            if proc.returncode != 0 or upd < args.max_update:
                failed.append(key)
                with open(os.path.join(save, "train.log"), errors="replace") as f:
                    tail = "".join(f.readlines()[-15:])
                log(f"{key[0]} seed {key[1]}: FAILED (exit {proc.returncode}, {upd} updates); see {save}/train.log:\n"
                    + tail)
                continue
            write_json(os.path.join(save, "train-done.json"),
                       dict(max_update=args.max_update, wall_s=round(wall, 1), jobs=args.jobs,
                            threads=args.threads, loss=loss, machine=this_machine()))
            log(f"{key[0]} seed {key[1]}: trained {upd} updates, {wall:.0f} s of training (last train loss {loss}); "
                "average + decode test sets")
            evaluate(args, *key)
            if args.archive:
                archive_run(args, *key)
            log(f"{key[0]} seed {key[1]}: " + ", ".join(
                f"{subset} BLEU {read_json(os.path.join(save, f'eval-{subset}', 'results.json'))['tok_bleu']}"
                for subset, _ in TEST_SETS))
        if active and status_due:
            last_status = time.time()
            log(progress_line(args, {key: start for key, (_, start, _, _) in active.items()}, pending))
    return failed


PACE_WINDOW = 600.0  # seconds: the progress line's pace is a training's over its latest 10 minutes


def recent_pace(segment, window=PACE_WINDOW):
    """Seconds per update of a training process over its last ``window`` seconds of logged updates, or over
    the whole process while it is younger: a pace (and finish time) that follows a change of neighbours,
    or a pause, within minutes instead of averaging it in for the rest of the run. None before its first
    logged update."""
    points = segment["points"]
    if points:
        last_t, last_u = points[-1]
        before = [(t, u) for t, u in points if t <= last_t - window]
        if before and last_u > before[-1][1]:
            return (last_t - before[-1][0]) / (last_u - before[-1][1])
    if segment["to_update"] > segment["from_update"]:
        return (segment["end"] - segment["start"]) / (segment["to_update"] - segment["from_update"])
    return None


def clock(seconds):
    """A duration as the progress line gives it: 42s, 17 min, 3.2 h."""
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def progress_line(args, active, pending, now=None):
    """The runner's live status: for every training in ``active`` ({(row, seed): start time}) its update,
    its current process's last train loss, time running and, once that process has logged updates, its
    seconds per update over the last 10 minutes (``recent_pace``) and when it will finish at that pace;
    then the trainings waiting and when all of them will be done: the updates left (a waiting run's from
    its log, a resumed one continues from its last checkpoint, within an epoch of that) at the mean pace
    of the running ones, --jobs at a time."""
    now = time.time() if now is None else now
    parts, paces, left = [], [], 0
    for (row, seed), start in active.items():
        train_log = os.path.join(run_dir(args.out, row, seed), "train.log")
        # the current process's own update and loss: an earlier, killed process may have logged
        # updates past the checkpoint this one resumed from
        segment = (training_segments(train_log) or [dict(from_update=0, to_update=0, loss=None, points=[])])[-1]
        upd, loss = segment["to_update"], segment["loss"]
        part = f"{row}/s{seed} {upd}/{args.max_update} loss {loss} ({clock(now - start)}"
        pace = recent_pace(segment)
        if pace:
            paces.append(pace)
            finish = datetime.datetime.fromtimestamp(now + max(args.max_update - upd, 0) * pace)
            part += f", {pace:.2f} s/update, done ~{finish:%H:%M}"
        parts.append(part + ")")
        left += max(args.max_update - upd, 0)
    line = "training: " + "; ".join(parts)
    if pending:
        line += f"; {len(pending)} waiting"
        if paces:
            left += sum(max(args.max_update - last_update(os.path.join(run_dir(args.out, *r), "train.log"))[0], 0)
                        for r in pending)
            pace = sum(paces) / len(paces)
            line += (f" (all done in about {clock(left * pace / args.jobs)} at {pace:.2f} s/update, "
                     f"{args.jobs} at a time)")
    return line


def sh(args, cmd, logfile):
    env = subprocess_env(args, PYTHON=sys.executable)
    with open(logfile, "a") as f:
        f.write("# " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if rc != 0:
        raise SystemExit(f"failed ({rc}): {' '.join(cmd)}; see {logfile}")


CHECKPOINT_NAME = re.compile(r"^checkpoint(?:(\d+)|_\d+_(\d+)|_last)\.pt$")


def checkpoint_updates(path):
    """The update count a fairseq checkpoint was saved at."""
    import torch

    state = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    return state["optimizer_history"][-1]["num_updates"]


def saved_models(save):
    """{update count: path} of every model a run saved: update checkpoints (count in the name), epoch
    checkpoints and checkpoint_last.pt (count read from the file; a named checkpoint wins a tie)."""
    found = {}
    for name in sorted(os.listdir(save)):  # checkpoint_last.pt sorts after every other checkpoint name
        m = CHECKPOINT_NAME.match(name)
        if m:
            path = os.path.join(save, name)
            found.setdefault(int(m.group(2)) if m.group(2) else checkpoint_updates(path), path)
    return found


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


def decode(args, row, checkpoint, subset, out, log_file):
    """fairseq-generate (beam --beam, lenpen 1) + scripts/score.py on one subset, unless done before."""
    if os.path.exists(os.path.join(out, "results.json")):
        return read_json(os.path.join(out, "results.json"))
    cmd = ["bash", os.path.join(ROOT, "scripts/evaluate.sh"), "--data", args.data + DATA_VARIANT.get(row, ""),
           "--checkpoint", checkpoint, "--out", out, "--subset", subset, "--beam", str(args.beam), "--lenpen", "1",
           "--no-compound-split", "--max-tokens", "4096"]
    if args.cpu:
        cmd += ["--", "--cpu"]
    sh(args, cmd, log_file)
    return read_json(os.path.join(out, "results.json"))


def evaluate(args, row, seed):
    save = run_dir(args.out, row, seed)
    if evaluated(save):  # nothing left to do (and no checkpoints needed: a run restored from --archive)
        return
    avg = average(args, save, args.average, args.max_update, os.path.join(save, f"checkpoint_avg{args.average}.pt"))
    for subset, _ in TEST_SETS:
        decode(args, row, avg, subset, os.path.join(save, f"eval-{subset}"), os.path.join(save, "eval.log"))
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
        outs = {subset: os.path.join(save, "curve", f"{final}-{subset}") for subset in ("valid", "test")}
        ckpt = None
        if not all(os.path.exists(os.path.join(o, "results.json")) for o in outs.values()):
            ckpt = average(args, save, args.average, final,
                           os.path.join(save, "curve", f"checkpoint_avg{args.average}_{final}.pt"), found)
        point = dict(update=final, valid_ppl=ppl.get(final))
        for subset, out in outs.items():
            point[subset] = decode(args, row, ckpt, subset, out, os.path.join(save, "curve", "eval.log"))["tok_bleu"]
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


def read_json(path):
    with open(path) as f:
        return json.load(f)


def replace_atomically(path, fill):
    """Have ``fill`` write PATH.tmp, then rename it to PATH: a kill at any moment leaves the old file or
    the new one, never a truncated one; a failed ``fill`` leaves no PATH.tmp."""
    try:
        fill(path + ".tmp")
        os.replace(path + ".tmp", path)
    finally:
        if os.path.exists(path + ".tmp"):
            os.remove(path + ".tmp")


def write_file(path, text):
    """Write PATH atomically: never a truncated file that the next run would die on (or a page cut short)."""
    def fill(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    replace_atomically(path, fill)


def copy_file(src, dst):
    """Copy SRC to DST atomically: archive_run and restore_run tell a finished copy by its last file being
    there, and repair_checkpoints rebuilds checkpoint_last.pt, so no file may be there half-copied."""
    replace_atomically(dst, lambda tmp: shutil.copyfile(src, tmp))


def write_json(path, obj, **dump_args):
    write_file(path, json.dumps(obj, **dump_args))


def mean_spread(values):
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


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


def paired_bootstrap(baseline_gen, system_gen, tok_ref, samples=1000):
    """(BLEU difference, p value) of a system against the baseline on the same sentences: sacreBLEU's
    paired bootstrap resampling on tokenized BLEU (the table's metric; sacreBLEU's fixed seed 12345)."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    refs = score.read_lines(tok_ref)
    base, system = score.read_generate(baseline_gen)[0], score.read_generate(system_gen)[0]
    test = PairedTest([("baseline", base), ("system", system)],
                      {"BLEU": BLEU(tokenize="none", smooth_method="none", force=True)}, [refs],
                      test_type="bs", n_samples=samples)
    _, scores = test()
    baseline, result = scores["BLEU"]
    return round(result.score - baseline.score, 2), result.p_value


def finished_test_decoding(args, row, seed):
    """The run's test_2016_flickr generate-test.txt once its decoding finished (results.json written last),
    else None: a running runner may still be writing it."""
    decoded = os.path.join(run_dir(args.out, row, seed), "eval-test")
    return os.path.join(decoded, "generate-test.txt") if os.path.exists(os.path.join(decoded, "results.json")) else None


def significance(args, rows, seeds_of, baseline=BASELINE):
    """{(row, seed): (difference, p)} against ``baseline`` of the same seed on test_2016_flickr."""
    out = {}
    ref = os.path.join(args.data, "ref", "test.tok.de")
    for row in rows:
        for seed in seeds_of[row]:
            base, gen = finished_test_decoding(args, baseline, seed), finished_test_decoding(args, row, seed)
            if row != baseline and base and gen:
                out[row, seed] = paired_bootstrap(base, gen, ref, args.bootstrap_samples)
    return out


def pair_comparisons(args, rows, seeds_of):
    """One line per --compare pair whose two rows are in the table: the first row's 2016 Flickr BLEU minus
    the second's, per seed both have, with the paired bootstrap's p (as the significance column)."""
    lines = []
    for system, base in args.compare:
        if system in rows and base in rows:
            seeds = [s for s in seeds_of[system] if s in seeds_of[base]]
            sig = significance(args, [system], {system: seeds}, baseline=base)
            lines.append(f"- {LABELS[system]} (`{system}`) minus {LABELS[base]} (`{base}`): "
                         + significance_cell(system, seeds, sig, baseline=base))
    return lines


def compare_pairs(value):
    """--compare: comma-separated ROW:ROW pairs of known rows ('' for none)."""
    pairs = []
    for item in filter(None, value.split(",")):
        pair = tuple(item.split(":"))
        if len(pair) != 2 or pair[0] == pair[1] or not set(pair) <= set(ROWS):
            raise argparse.ArgumentTypeError(f"expected ROW:ROW of two different rows of {', '.join(ROWS)}, got {item!r}")
        pairs.append(pair)
    return pairs


def significance_cell(row, seeds, sig, baseline=BASELINE):
    if row == baseline:
        return "baseline"
    parts = []
    for seed in seeds:
        if (row, seed) in sig:
            diff, p = sig[row, seed]
            text = f"s{seed} {diff + 0.0:+.2f} (p={p:.3f})"  # + 0.0: a difference rounded to -0.0 reads +0.00
            # not bold without a difference: sacreBLEU's p is (c + 1) / (n + 1), 1 / (n + 1) for identical outputs
            parts.append(f"**{text}**" if p < 0.05 and diff != 0 else text)
        else:
            parts.append(f"s{seed} –")
    return " / ".join(parts)


def close_rows(args, rows, seeds, results):
    """The rows that get --close-seeds: the main rows (not ABLATIONS) whose mean test_2016_flickr BLEU over
    --seeds is within --close-within of the pre-norm transformer's, and the pre-norm transformer itself when
    any row is (the significance column compares runs of the same seed). None until every run of --seeds
    is decoded."""
    if not args.close_seeds or BASELINE not in rows:
        return []
    means = {}
    for row in rows:
        bleu = [results[row, s]["bleu"].get("test") for s in seeds]
        if None in bleu:
            return []
        means[row] = statistics.mean(bleu)
    close = [r for r in rows if r not in (BASELINE, *ABLATIONS) and abs(means[r] - means[BASELINE]) <= args.close_within]
    return [r for r in rows if r == BASELINE or r in close] if close else []


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


def updates_per_epoch(args, rows, seeds):
    """Updates per epoch, read from the first trained run's log (fairseq's ``epoch 003:  75 / 240``)."""
    for row in rows:
        for seed in seeds:
            train_log = os.path.join(run_dir(args.out, row, seed), "train.log")
            if os.path.exists(train_log):
                with open(train_log, errors="replace") as f:
                    first_epoch = None
                    for line in f:  # a progress line, or the summary of epoch 1 once epoch 2 began
                        m = re.search(r"epoch \d+:\s+\d+ / (\d+) ", line)
                        if m:
                            return int(m.group(1))
                        m = re.search(r"\[train\]\[INFO\] - epoch 001 \|.*\| num_updates (\d+) ", line)
                        if m:
                            first_epoch = int(m.group(1))
                        elif first_epoch and re.search(r"epoch 002|begin training epoch 2\b", line):
                            return first_epoch
    return None


def table(args, rows, seeds, results, seeds_of=None):
    """The markdown table: every row over its seeds in ``seeds_of`` (default: --seeds; the close rows'
    --close-seeds too)."""
    seeds_of = seeds_of or {row: seeds for row in rows}
    close = any(seeds_of[row] != seeds for row in rows)
    lines = []
    per_epoch = updates_per_epoch(args, rows, seeds)
    epochs = f" (about {args.max_update / per_epoch:.0f} epochs of {per_epoch} updates)" if per_epoch else ""
    machines = {}  # the CPU each run trained on (runs.json); several: the table says which ran where
    for row in rows:
        for seed in seeds_of[row]:
            if "machine" in results[row, seed]:
                machines.setdefault(results[row, seed]["machine"], []).append(f"`{row}` s{seed}")
    hw = args.hardware or (next(iter(machines)) if len(machines) == 1 else
                           "several machines, listed below the table" if machines else this_machine())
    every = "every epoch end" if args.save_every == "epoch" else f"{args.save_every} updates apart"
    lines += [f"Budget: {args.max_update} updates of {args.max_tokens} tokens per row and seed{epochs} "
              f"(reference: 8,000 x 8,192), lr {lr_of(args)}, warm-up {warmup_updates(args.max_update, args.warmup)}, "
              f"seeds {','.join(map(str, seeds))}"
              + (f" (and {','.join(map(str, args.close_seeds))} for the main rows within {args.close_within:g} BLEU "
                 "of the pre-norm transformer on 2016 Flickr, and that row)" if close else "")
              + f", {precision_of(args)}, "
              f"{args.jobs} training job(s) at a time"
              f"{f' with {args.threads} thread(s) each' if args.threads else ''}"
              f"{', glibc malloc with mmap off (--malloc reuse)' if args.cpu and args.malloc == 'reuse' else ''}"
              f"; hardware: {hw}. "
              f"{'Overrides: `' + ' '.join(args.override) + '`. ' if args.override else ''}"
              f"Average of the last {args.average} checkpoints (saved {every}; the last is the final model), "
              f"beam {args.beam}, lenpen 1. "
              "BLEU: tokenized (multi-bleu style on the lowercased Moses-tokenized text, no compound splitting), "
              "mean ± standard deviation over seeds.", ""]
    sig = significance(args, rows, seeds_of) if args.significance else None
    if sig is not None:
        lines[-2] += (" Last column: 2016 Flickr tokenized BLEU difference to the pre-norm transformer of the same "
                      f"seed (sN: seed N), p of sacreBLEU's paired bootstrap ({args.bootstrap_samples} samples); "
                      "bold: p < 0.05 and a difference.")
    def mean_time(runs, wall=False):
        """(seconds per run, True if wall time stands in for CPU time) over ``runs``: on the CPU (unless
        ``wall``) the mean CPU time of those that recorded it, else (runs trained before the runner recorded
        it) their mean wall time; on a GPU the mean wall time. (None, False) before any run finished."""
        cpu = [r["train_cpu_s"] for r in runs if "train_cpu_s" in r] if args.cpu and not wall else []
        if cpu:
            return statistics.mean(cpu), False
        walls = [r["train_wall_s"] for r in runs if "train_wall_s" in r]
        return (statistics.mean(walls), args.cpu) if walls else (None, False)

    def train_time(row):
        """A row's ``mean_time`` over its seeds."""
        return mean_time([results[row, s] for s in seeds_of[row]])

    def run_time(run, wall):
        """One run's seconds in the measure its row's time cell uses (CPU time, or wall time where ``wall``)."""
        return run.get("train_wall_s" if wall or not args.cpu else "train_cpu_s")

    def baseline_time_on(machine, wall):
        """The pre-norm transformer's mean time over its runs on ``machine`` (None: no such run). A time ratio
        divides by the baseline of the same CPU only: across CPUs it would measure the CPUs too (a Zen 4
        core trained Prime at 0.67 s per update, the Zen/Zen 2 core of the machine before it at 1.66)."""
        return mean_time([results[BASELINE, s] for s in seeds_of.get(BASELINE, ())
                          if results[BASELINE, s].get("machine") == machine], wall)[0]

    def time_ratio(row, wall):
        """Mean over the row's runs of run time / pre-norm time on the same machine; None if no run of the row
        has a pre-norm run on its machine."""
        ratios = []
        for seed in seeds_of[row]:
            run = results[row, seed]
            seconds, base = run_time(run, wall), baseline_time_on(run.get("machine"), wall)
            if seconds and base:
                ratios.append(seconds / base)
        return statistics.mean(ratios) if ratios else None

    wall_for_cpu = False
    head = ("| row | params | " + " | ".join(f"{name} BLEU" for _, name in TEST_SETS)
            + f" | 2016 Flickr sacreBLEU | hyp/ref length | valid ppl | train {'CPU' if args.cpu else 'wall'} time / run"
            + " | published |"
            + (" vs pre-norm transformer, per seed |" if sig is not None else ""))
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    signature = None
    samples = {}
    for row in rows:
        runs = [results[row, seed] for seed in seeds_of[row]]
        per_set = {s: [r["bleu"][s] for r in runs if s in r["bleu"]] for s, _ in TEST_SETS}
        sacre = [r["sacrebleu"] for r in runs if "sacrebleu" in r]
        ratios = [r["length_ratio"] for r in runs if "length_ratio" in r]
        ppls = [r["valid_ppl"] for r in runs if "valid_ppl" in r]
        params = next((r["parameters"] for r in runs if "parameters" in r), None)
        signature = next((r["sacrebleu_signature"] for r in runs if "sacrebleu_signature" in r), signature)
        gen = next(filter(None, (finished_test_decoding(args, row, seed) for seed in seeds_of[row])), None)
        if gen:
            samples[row] = dict(enumerate(score.read_generate(gen)[0]))
        n = len(per_set["test"])
        cells = [LABELS[row] + f" (`{row}`)", f"{params / 1e6:.2f}M" if params else "–"]
        cells += [mean_spread(per_set[s]) for s, _ in TEST_SETS]
        seconds, wall = train_time(row)
        spent = f"{seconds / 60:.1f} min" if seconds else "–"
        ratio = time_ratio(row, wall) if seconds and BASELINE in rows else None
        if ratio:
            spent += f" ({ratio:.2f}x)"
        elif seconds and BASELINE in rows and any(baseline_time_on(m, wall) for m in machines):
            spent += " (no pre-norm run on its machine)"
        if wall:
            spent += " †"
            wall_for_cpu = True
        cells += [mean_spread(sacre), mean_spread(ratios), mean_spread(ppls), spent,
                  f"{REFERENCE[row]} (8,000 updates, 2 GPUs)" if row in REFERENCE else ""]
        if sig is not None:
            cells.append(significance_cell(row, seeds_of[row], sig))
        if n != len(seeds_of[row]):
            cells[0] += f" ({n} of {len(seeds_of[row])} seeds)"
        lines.append("| " + " | ".join(cells) + " |")
    pairs = pair_comparisons(args, rows, seeds_of) if sig is not None else []
    if pairs:
        lines += ["", "Paired comparisons on 2016 Flickr (`--compare`: tokenized BLEU of the first row minus the "
                  "second's, same seed, p of the same paired bootstrap; bold: p < 0.05):", ""] + pairs
    if len(machines) > 1:  # which run trained where: a time in minutes averages over these CPUs
        lines += ["", "Trained on different machines: "
                  + "; ".join(f"{m}: {', '.join(runs)}" for m, runs in machines.items())
                  + ". A time ratio is each run's time over the pre-norm transformer's on the same machine, "
                  "averaged over the row's runs that have one; a time in minutes averages over CPUs."]
    if wall_for_cpu:
        lines += ["", "†: wall time, no run of the row recorded CPU time (trained before the runner recorded it; "
                  "wall time grows with whatever else ran on the machine). Elsewhere CPU time, over the runs "
                  "that recorded it."]
    if signature:
        lines += ["", f"sacreBLEU signature: `{signature}`"]
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


def save_every(value):
    """--save-every: a positive number of updates, or 'epoch'."""
    if value == "epoch":
        return value
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of updates or 'epoch', got {value!r}")
    return int(value)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="the data-bin of prepare-multi30k.sh (required but with --redraw)")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows (default: all)")
    p.add_argument("--seeds", default="1,2", help="comma-separated seeds (default: 1,2)")
    p.add_argument("--max-update", type=int, default=8000, help="updates per run (reference: 8000)")
    p.add_argument("--max-tokens", type=int, default=8192, help="tokens per update (reference: 8192)")
    p.add_argument("--average", type=int, default=5,
                   help="average the last N checkpoints, --save-every apart, the last being the final model (default: 5)")
    p.add_argument("--save-every", type=save_every, default=50,
                   help="updates between checkpoints, or 'epoch' for a checkpoint at every epoch end "
                        "(default: 50, about one epoch at 8,192 tokens)")
    p.add_argument("--keep", type=int, help="checkpoints kept per run (default: --average; 0: all, for --curve-every)")
    p.add_argument("--warmup", type=int,
                   help="warm-up updates (default: the reference's 2,000 of 8,000 in proportion to --max-update); "
                        "fixed, a longer run's checkpoints are those of a shorter one (inverse-sqrt schedule)")
    p.add_argument("--significance", action="store_true",
                   help=f"compare every row with {BASELINE} of the same seed (paired bootstrap) in a last column")
    p.add_argument("--compare", type=compare_pairs, default=compare_pairs(COMPARE),
                   help="with --significance, also compare these rows directly, as comma-separated FIRST:SECOND "
                        f"pairs (first minus second, same seed; '' for none; default: {COMPARE})")
    p.add_argument("--close-seeds", default="",
                   help="comma-separated seeds trained after --seeds for every main row (not the parse ablations) "
                        f"whose mean 2016 Flickr BLEU is within --close-within of {BASELINE}'s, and then for "
                        f"{BASELINE} too (e.g. 3)")
    p.add_argument("--close-within", type=float, default=1.0,
                   help="BLEU: how close a row's mean must be to get --close-seeds (default: 1.0)")
    p.add_argument("--bootstrap-samples", type=int, default=1000, help="paired bootstrap resamples (default: 1000)")
    p.add_argument("--curve-every", type=int,
                   help="after training, BLEU on valid and test of the average ending at every N-th update "
                        "(needs --keep 0): OUT/ROW/seedS/budget-curve.json and OUT/bleu-curve.png")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--jobs", type=int, default=1, help="trainings at a time (several fit on one GPU)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads per training (OMP/MKL; 0 = torch's default)")
    p.add_argument("--cpu", action="store_true", help="train and decode on the CPU")
    p.add_argument("--malloc", choices=["reuse", "system"], default="reuse",
                   help="on the CPU: 'reuse' (default) runs the trainings and decodings with glibc's mmap off "
                        "(MALLOC_MMAP_MAX_=0), so freed tensors are reused instead of unmapped and faulted in "
                        "again every step (faster, same numbers); 'system' leaves malloc as it is")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--out", default="runs/multi30k", help="where runs go (default: runs/multi30k)")
    p.add_argument("--archive",
                   help="copy every finished run's logs, scores and hypotheses (no checkpoints) to ARCHIVE/ROW/seedS, "
                        "and take runs found there as done: a table that outlives the machine (e.g. a folder "
                        "under version control)")
    p.add_argument("--docs", help="also write the table between the multi30k-table markers of this file")
    p.add_argument("--docs-block", default="",
                   help="write between the multi30k-table:NAME markers instead (a second table on the same page)")
    p.add_argument("--hardware", help="hardware named in the table and its picture (default: the CPUs the runs "
                                      "recorded, as /proc/cpuinfo names them, with vector extensions and core count)")
    p.add_argument("--status-every", type=float, default=30.0, help="seconds between progress lines")
    p.add_argument("--table-only", action="store_true", help="only (re)write the table from finished runs")
    p.add_argument("--redraw", metavar="FILE[:KEY]",
                   help="only draw a table's picture again from its runs.json (OUT/valid-ppl.png) or a budget-curve "
                        "record (OUT/bleu-curve.png), with its budget and hardware; no runs or data needed. KEY "
                        "picks one record of a file holding several (docs/results/*.json)")
    p.add_argument("override", nargs="*", help="extra hydra overrides for every training, e.g. common.log_interval=10")
    args = p.parse_args(argv)
    args.out = os.path.abspath(args.out)
    if args.redraw:
        return redraw(args)
    if not args.data:
        p.error("the following arguments are required: --data")
    args.data = os.path.abspath(args.data.rstrip("/"))
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; rows: {', '.join(ROWS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    args.close_seeds = [int(s) for s in args.close_seeds.split(",") if s]
    if set(args.close_seeds) & set(seeds):
        p.error(f"--close-seeds {args.close_seeds} repeats seeds of --seeds {seeds}")
    if args.save_every != "epoch" and args.max_update % args.save_every:
        p.error(f"--max-update {args.max_update} must be a multiple of --save-every {args.save_every} "
                "(the last checkpoint must hold the final update)")
    for r in rows:
        data = args.data + DATA_VARIANT.get(r, "")
        if not os.path.isdir(data):
            p.error(f"row {r} needs the data-bin {data} (run scripts/prepare-multi30k.sh)")
    if args.archive:
        args.archive = os.path.abspath(args.archive)
        for s in seeds + args.close_seeds:
            for r in rows:
                restore_run(args, r, s)
    failed = []
    if not args.table_only:
        runs = [(r, s) for s in seeds for r in rows]  # seed-major: every row gets one seed first
        log(f"{len(runs)} runs: {len(rows)} rows x seeds {seeds}, {args.max_update} updates each, "
            f"{args.jobs} at a time; output {args.out}")
        failed = train_all(args, runs)
    results = {(r, s): run_results(args, r, s) for s in seeds for r in rows}  # read every run once
    close = close_rows(args, rows, seeds, results)
    if close:
        log(f"within {args.close_within:g} BLEU of {BASELINE} on 2016 Flickr: {', '.join(close)}: "
            f"seeds {','.join(map(str, args.close_seeds))} too")
        if not args.table_only:
            failed += train_all(args, [(r, s) for s in args.close_seeds for r in close])
        results.update({(r, s): run_results(args, r, s) for s in args.close_seeds for r in close})
    if not args.table_only and failed:
        log(f"failed runs: {failed}")
    seeds_of = {r: seeds + (args.close_seeds if r in close else []) for r in rows}
    text = table(args, rows, seeds, results, seeds_of)
    os.makedirs(args.out, exist_ok=True)
    write_file(os.path.join(args.out, "table.md"), text)
    picture = os.path.join(args.out, "valid-ppl.png")
    drawn = plot_valid_curves(args, rows, seeds_of, results, picture)
    if drawn:
        log(f"validation curves: {picture}")
    budget = {k: getattr(args, k) for k in ("max_update", "max_tokens", "average", "save_every", "beam", "jobs",
                                            "threads", "cpu", "fp16", "bf16", "override", "hardware",
                                            "close_seeds", "close_within")}
    write_json(os.path.join(args.out, "runs.json"),  # every run, per seed
               {"budget": dict(budget, warmup_updates=warmup_updates(args.max_update, args.warmup)),
                "runs": list(results.values())}, indent=1)
    if args.curve_every:
        curves = {(r, s): budget_curve(args, r, s, args.curve_every) for r in rows for s in seeds_of[r]}
        plot_budget_curves(args, curves, os.path.join(args.out, "bleu-curve.png"),
                           hardware_of(args, results, curves))
    if args.docs:
        if drawn:  # the block shows this table's validation curves, from the page's img/
            name = f"multi30k-{args.docs_block or 'table'}-valid-ppl.png"
            img = os.path.join(os.path.dirname(os.path.abspath(args.docs)), "img")
            os.makedirs(img, exist_ok=True)
            copy_file(picture, os.path.join(img, name))
            text += f"\n![Validation perplexity against updates, every run of this table](img/{name})\n"
        begin, end = markers(args.docs_block)
        doc = open(args.docs, encoding="utf-8").read()
        if begin not in doc or end not in doc:
            raise SystemExit(f"{args.docs}: no {begin} ... {end} markers to write the table between")
        head, rest = doc.split(begin, 1)
        _, tail = rest.split(end, 1)
        write_file(args.docs, head + begin + "\n" + text + end + tail)
    print(text)
    log(f"table: {os.path.join(args.out, 'table.md')}")
    return 1 if not args.table_only and failed else 0


if __name__ == "__main__":
    sys.exit(main())
