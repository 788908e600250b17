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
import os

from umst_tools.multi30k.archive import restore_run, write_archive_readme
from umst_tools.multi30k.config import BASELINE, COMPARE, DATA_VARIANT, ROWS, compare_pairs, markers, save_every, warmup_updates
from umst_tools.multi30k.evaluation import budget_curve, run_results
from umst_tools.multi30k.files import copy_file, log, write_file, write_json
from umst_tools.multi30k.machine import hardware_of
from umst_tools.multi30k.plots import plot_budget_curves, plot_valid_curves, redraw
from umst_tools.multi30k.significance import close_rows
from umst_tools.multi30k.tables import table
from umst_tools.multi30k.training import train_all


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="the data-bin of prepare-multi30k.sh (required but with --redraw, and with "
                                  "--table-only --archive: the table from the archive alone)")
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
    p.add_argument("--fp16", action="store_true", help="fairseq's fp16 (half weights, dynamic loss scale; GPUs)")
    p.add_argument("--bf16", action="store_true",
                   help="pure bf16 weights with an fp32 master copy (fairseq's common.bf16; not autocast)")
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
    if not args.data and not (args.table_only and args.archive):
        p.error("the following arguments are required: --data (or --table-only --archive DIR: the table from an "
                "archive alone)")
    args.data = os.path.abspath(args.data.rstrip("/")) if args.data else None
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
    for r in rows if args.data else []:
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
    if args.archive:
        write_archive_readme(args, results)
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
