"""Paired bootstrap significance, the pairs compared, and the rows close to the baseline."""
import statistics

from umst_tools import score

from umst_tools.multi30k.archive import reference_file
from umst_tools.multi30k.config import ABLATIONS, BASELINE, LABELS
from umst_tools.multi30k.evaluation import finished_test_decoding


def mean_spread(values):
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


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


def significance(args, rows, seeds_of, baseline=BASELINE):
    """{(row, seed): (difference, p)} against ``baseline`` of the same seed on test_2016_flickr."""
    out = {}
    ref = reference_file(args, "ref/test.tok.de")
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
