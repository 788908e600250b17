"""The markdown table of the comparison."""
import os
import statistics

from umst_tools import score

from umst_tools.multi30k.archive import reference_file
from umst_tools.multi30k.config import BASELINE, LABELS, REFERENCE, SAMPLE_IDS, TEST_SETS, lr_of, precision_of, warmup_updates
from umst_tools.multi30k.evaluation import finished_test_decoding
from umst_tools.multi30k.machine import this_machine
from umst_tools.multi30k.runs import updates_per_epoch
from umst_tools.multi30k.significance import mean_spread, pair_comparisons, significance, significance_cell


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
    if len(machines) > 1:
        head = head.replace(f"train {'CPU' if args.cpu else 'wall'} time / run",
                            f"train {'CPU' if args.cpu else 'wall'} time vs pre-norm, same machine")
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
        ratio = time_ratio(row, wall) if seconds and BASELINE in rows else None
        if len(machines) > 1:  # minutes of different CPUs do not average: the per-machine ratio alone
            spent = f"{ratio:.2f}x" if ratio else "–"
        else:
            spent = (f"{seconds / 60:.1f} min" if seconds else "–") + (f" ({ratio:.2f}x)" if ratio else "")
        if not ratio and seconds and BASELINE in rows and any(baseline_time_on(m, wall) for m in machines):
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
                  + ". The time column is each run's time over the pre-norm transformer's on the same machine, "
                  "averaged over the row's runs that have one; every run's minutes, with its machine: "
                  "`runs.json` (and an archive's README, `--archive`)."]
    if wall_for_cpu:
        lines += ["", "†: wall time, no run of the row recorded CPU time (trained before the runner recorded it; "
                  "wall time grows with whatever else ran on the machine). Elsewhere CPU time, over the runs "
                  "that recorded it."]
    if signature:
        lines += ["", f"sacreBLEU signature: `{signature}`"]
    src = reference_file(args, "tok/test.en")  # as the model read it (tokenized, cased as the recipe)
    ref = reference_file(args, "ref/test.tok.de")
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
