"""The pictures: validation curves, BLEU against budget, and redrawing them from a results record."""
import os
import textwrap

from umst_tools.multi30k.config import LABELS, LR_OVERRIDE, REFERENCE, lr_of, precision_of, warmup_updates
from umst_tools.multi30k.files import log, read_json
from umst_tools.multi30k.machine import hardware_of


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
