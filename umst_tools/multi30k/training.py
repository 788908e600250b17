"""Training every run: claiming a run, parallel trainings, evaluation and archiving as each ends, progress."""
import datetime
import os
import subprocess
import time

from umst_tools.multi30k.archive import adopt_longer_run, archive_run, check_same_settings
from umst_tools.multi30k.config import ROOT, SEGMENT_HEADER, TEST_SETS, run_dir
from umst_tools.multi30k.evaluation import evaluate
from umst_tools.multi30k.files import clock, log, read_json, write_json
from umst_tools.multi30k.logs import last_update, recent_pace, training_segments, training_time
from umst_tools.multi30k.machine import die_with_parent, reap, record_cpu_time, this_machine
from umst_tools.multi30k.runs import forget_results, repair_checkpoints, subprocess_env, train_cmd, trained


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
