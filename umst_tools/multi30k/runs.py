"""One run's commands and state: the training command, its environment, resumable checkpoints, outputs."""
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

from umst_tools.multi30k.config import CONFIGS, DATA_VARIANT, ROOT, TEST_SETS, run_dir, warmup_updates
from umst_tools.multi30k.files import copy_file
from umst_tools.multi30k.logs import CHECKPOINT_NAME, checkpoint_updates


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
           f"task.data={(args.data or '') + DATA_VARIANT.get(row, '')}", f"common.user_dir={ROOT}/umst_plugin",
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


def trained(save, max_update):
    stamp = os.path.join(save, "train-done.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            return json.load(f).get("max_update") == max_update
    return False


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


def evaluated(save):
    """Every test set decoded and the parameters counted: nothing of evaluate() is left to do."""
    return os.path.exists(os.path.join(save, "params.json")) and all(
        os.path.exists(os.path.join(save, f"eval-{subset}", "results.json")) for subset, _ in TEST_SETS)


def sh(args, cmd, logfile):
    env = subprocess_env(args, PYTHON=sys.executable)
    with open(logfile, "a") as f:
        f.write("# " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if rc != 0:
        raise SystemExit(f"failed ({rc}): {' '.join(cmd)}; see {logfile}")


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
