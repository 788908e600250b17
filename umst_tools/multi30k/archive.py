"""The archive that outlives the machine: a run's settings compared by content, archiving and restoring."""
import os

from umst_tools.multi30k.config import CPU_TIME, TEST_SETS, run_dir
from umst_tools.multi30k.files import copy_file, log, read_json, write_file, write_json
from umst_tools.multi30k.logs import last_update, training_time
from umst_tools.multi30k.runs import evaluated, forget_results, train_cmd, trained


# Overrides naming where a run's files are: the same training elsewhere (another clone, another --out)
RUN_LOCATION = ("checkpoint.save_dir=", "hydra.run.dir=", "common.user_dir=")


def settings(cmd, portable=False, with_data=True):
    """What decides a training's model, by content: its config's name and the hydra overrides (all but the
    budget and how many checkpoints are kept), as a set; never the Python or the configs' folder, which name
    where the checkout was. ``portable``: also without where the run and the plugin were, and the data-bin by
    its name only (an archived run trained on another machine or clone); ``with_data=False``: without the
    data-bin at all (a table rebuilt from an archive, no data-bin given)."""
    args = cmd.split() if isinstance(cmd, str) else list(cmd)
    args = args[args.index("fairseq_cli.hydra_train") + 1:] if "fairseq_cli.hydra_train" in args else args
    if "--config-dir" in args:  # a path: the same config in another clone is the same config
        i = args.index("--config-dir")
        del args[i:i + 2]
    out = {a for a in args if not a.startswith(("optimization.max_update=", "checkpoint.keep_"))}
    if portable:
        out = {f"task.data={os.path.basename(a.split('=', 1)[1])}" if a.startswith("task.data=") else a
               for a in out if not a.startswith(RUN_LOCATION)}
    if not with_data:
        out = {a for a in out if not a.startswith("task.data=")}
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
    with_data = args.data is not None
    want = settings(train_cmd(args, row, seed, save), portable, with_data)
    for header in headers:
        got = settings(header, portable, with_data)
        if got != want:
            raise SystemExit(f"{where} {what} with other settings: {sorted(got ^ want)}; use another {option}")


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
    archive_references(args)
    log(f"{row} seed {seed}: archived to {dest}")


REFERENCES = ("ref/test.tok.de", "ref/test1.tok.de", "ref/test2.tok.de", "tok/test.en")


def reference_file(args, name):
    """A test set's reference (``ref/test.tok.de``) or tokenized source (``tok/test.en``): from the data-bin's
    recipe folders, or, with no --data (a table rebuilt from the archive), from ARCHIVE/ref, tok."""
    if args.data is not None:
        folder, base = name.split("/")
        return os.path.join(args.data, "ref", base) if folder == "ref" else \
            os.path.join(args.data, "..", "..", folder, base)
    return os.path.join(args.archive or "", name)


def archive_references(args):
    """Keep the test references and tokenized sources beside the archived runs (once): the paired bootstrap
    and the sample sentences read them, so a table rebuilt from the archive needs no data-bin."""
    for name in REFERENCES:
        src, dest = reference_file(args, name), os.path.join(args.archive, name)
        if os.path.exists(src) and not os.path.exists(dest):
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            copy_file(src, dest)


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


README_HEAD = """# Archive of the Multi30k runs

Written by `scripts/multi30k_table.py --archive DIR`: one folder `ROW/seedS` per finished and decoded run, holding
what the table reads and no checkpoint, and `ref/`, `tok/`: the test references and tokenized sources the paired
bootstrap and the sample sentences read. The same command on a fresh machine (or `--table-only --archive DIR`
without `--data`) takes these runs as done and rewrites the table from them.

| file | what |
|---|---|
| `train.log` | fairseq-hydra-train's whole log, one `# started ...` header (with the command) per training segment |
| `train-done.json` | budget, wall time, jobs, threads and the CPU the run trained on (`machine`) |
| `cpu-time.json` | CPU seconds of each training segment |
| `params.json`, `checkpoint_avgN.json` | parameters of the averaged model; the checkpoints it averages |
| `eval-{test,test1,test2}/results.json` | tokenized BLEU, sacreBLEU with signature, lengths (test = 2016 Flickr, test1 = 2017 Flickr, test2 = 2017 MSCOCO) |
| `eval-*/generate-*.txt` | fairseq-generate's hypotheses and targets (`H-`, `T-` lines) and its BLEU line |
| `eval-*/hyp.detok.txt` | the detokenized hypotheses sacreBLEU scored |

## The runs

Every archived run: the CPU it trained on (as `/proc/cpuinfo` names it), its training CPU time (user + system of
the training process, per update over the recorded segments, times the budget; wall time where no CPU time
was recorded, marked †) and its 2016 Flickr tokenized BLEU.
"""


def write_archive_readme(args, results):
    """ARCHIVE/README.md: what the folder holds, and one line per archived run (machine, CPU time, BLEU)."""
    rows = []
    for (row, seed), run in sorted(results.items()):
        if not os.path.exists(os.path.join(run_dir(args.archive, row, seed), "train-done.json")):
            continue
        cpu = run.get("train_cpu_s")
        time = f"{cpu / 60:.1f} min" if cpu else (f"{run['train_wall_s'] / 60:.1f} min †"
                                                  if run.get("train_wall_s") else "–")
        bleu = run.get("bleu", {}).get("test")
        rows.append(f"| `{row}` | {seed} | {run.get('machine', '–')} | {time} | "
                    f"{bleu if bleu is not None else '–'} |")
    table = "\n".join(["| row | seed | machine | training time | 2016 Flickr BLEU |", "|---|---|---|---|---|"] + rows)
    write_file(os.path.join(args.archive, "README.md"), README_HEAD + "\n" + table + "\n")
