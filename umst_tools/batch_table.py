"""The effective batch of every WMT table row, and the update_freq ``scripts/train.sh`` uses on N nodes x G GPUs.

A row's config (``configs/ROW.yaml``) states the GPU count its batch assumes (``distributed_world_size``), its
``update_freq`` and ``max_tokens``: tokens per update = max_tokens x update_freq x GPUs. train.sh keeps that
product on another number of GPUs by scaling update_freq (``update_freq x assumed / (nodes x gpus)``, at least 1).

On a large card the batch per card is larger than the papers' (their 16-32 GB cards): :func:`card_plan` gives, for
1, 8 and 16 cards, the ``--max-tokens`` per card (at most :data:`CARD_TOKENS`, the largest the recipes use on an
80 GB or larger card) and the update_freq that give the paper's tokens per update exactly -- what
``train.sh --max-tokens T`` then plans; and, where a speed table of the card exists
(``docs/results/gpu-speed-<card>-<commit>.json``, ``benchmarks/speed_table.py``), the hours of the row on 1 and 8
cards from its measured words/s.

    python -m umst_tools.batch_table            # the markdown table of docs/wmt-on-gpus.md
    python -m umst_tools.batch_table --cards    # the batch per card on 1, 8 and 16 cards, and the hours
"""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTERS = ((1, 8), (2, 8))  # (nodes, GPUs per node) of the sbatch scripts
CARDS = (1, 8, 16)
# the largest --max-tokens per card the recipes use on an 80 GB or larger card: base width 38,400 (the speed table's
# batch), big width half of it
CARD_TOKENS = {"base": 38400, "big": 19200}
# hours are given where the batch per card is at least this fraction of the speed table's: on the H200 the plugin
# transformer's words/s per card fell from about 250,000 at 38,400 tokens to about 40,000-50,000 at 4,096
MEASURED_FRACTION = 0.8


def _value(text, section, key):
    """A scalar or one-element list under ``section:`` in a YAML file (no YAML library: fairseq-free, fast)."""
    block = re.search(rf"^{section}:\n((?:[ \t]+.*\n?)+)", text, flags=re.M)
    if not block:
        return None
    m = re.search(rf"^[ \t]+{key}:[ \t]*\[?([0-9]+)\]?", block.group(1), flags=re.M)
    return int(m.group(1)) if m else None


def _name(text, section):
    block = re.search(rf"^{section}:\n((?:[ \t]+.*\n?)+)", text, flags=re.M)
    m = re.search(r"^[ \t]+_name:[ \t]*(\S+)", block.group(1), flags=re.M) if block else None
    return m.group(1) if m else None


# Model keys a row's config may set that change its cost per token: a row is given hours only where its values are
# the measured row's (its command line's, else its arch's defaults)
SHAPE_KEYS = ("encoder_layers", "decoder_layers", "encoder_blocks", "encoder_layers_per_block", "encoder_embed_dim",
              "decoder_embed_dim", "encoder_ffn_embed_dim", "decoder_ffn_embed_dim")
# a config's arch measured under another name: the same model (the plugin transformer row is fairseq's base shape)
SAME_ARCH = {"transformer_wmt_en_de": "transformer"}


def row_batch(config_path):
    with open(config_path) as f:
        text = f.read()
    gpus = _value(text, "distributed_training", "distributed_world_size") or 1
    update_freq = _value(text, "optimization", "update_freq") or 1
    max_tokens = _value(text, "dataset", "max_tokens")
    return dict(row=os.path.basename(config_path)[:-5], assumed_gpus=gpus, update_freq=update_freq,
                max_tokens=max_tokens, tokens_per_update=max_tokens * update_freq * gpus if max_tokens else None,
                arch=_name(text, "model"), max_update=_value(text, "optimization", "max_update"),
                shape={k: v for k in SHAPE_KEYS if (v := _value(text, "model", k)) is not None})


def width(batch):
    return "big" if "big" in batch["row"] else "base"


def card_plan(tokens_per_update, cards, cap):
    """(--max-tokens per card, update_freq) giving exactly ``tokens_per_update`` on ``cards``: the fewest steps per
    update whose batch per card is at most ``cap``; None where no whole batch per card does."""
    if tokens_per_update % cards:
        return None
    per_card = tokens_per_update // cards
    update_freq = max(1, -(-per_card // cap))
    while per_card % update_freq:
        update_freq += 1
    return per_card // update_freq, update_freq


def speed_records(results_dir=os.path.join(ROOT, "docs", "results")):
    """The GPU speed tables there, newest first by their start time: (card, record)."""
    import json

    out = []
    for path in glob.glob(os.path.join(results_dir, "gpu-speed-*.json")):
        with open(path) as f:
            record = json.load(f)
        if record.get("card") and record.get("rows"):
            out.append((record["card"], record))
    return sorted(out, key=lambda cr: cr[1].get("started", ""), reverse=True)


def arch_args(arch, given):
    """The model arguments of ``arch`` built from ``given`` (fairseq argument name -> value) as fairseq builds them:
    its architecture function fills what ``given`` leaves unset, from what it sets where a default depends on
    another argument (``decoder_embed_dim`` is ``encoder_embed_dim``'s value unless set). Imports fairseq and the
    plugin (only for a config or row that sets a shape key)."""
    import argparse

    import umst_plugin  # noqa: F401  (registers the plugin's archs)
    from fairseq.models import ARCH_CONFIG_REGISTRY

    namespace = argparse.Namespace(**given)
    ARCH_CONFIG_REGISTRY[arch](namespace)
    return vars(namespace)


def _same_shape(shape, row):
    """Whether the config's model and the measured row's have the same value of every shape key, each model as
    fairseq builds it: the keys the config (``shape``) or the row's command line sets, the rest from the arch's
    function (:func:`arch_args`). Both ways: a row measured at another shape than its arch's defaults
    (UMST's MUSE, ``prime_base`` at 6+6 layers) is not the row of a config that keeps them
    (``prime-t2-prime-base``)."""
    argv = row.get("argv", [])
    measured = {key: int(argv[argv.index(flag) + 1]) for key in SHAPE_KEYS
                if (flag := "--" + key.replace("_", "-")) in argv}
    if not measured and not shape:  # both the arch's defaults
        return True
    built, configured = arch_args(row["arch"], measured), arch_args(row["arch"], dict(shape))
    return all(built.get(key) == configured.get(key) for key in SHAPE_KEYS)


def measured_rows(batch, record):
    """The record's bf16 plugin rows of the batch's arch and shape (:data:`SHAPE_KEYS`: MSC's 36 and 48 layers are
    not its measured 6) at its recipe batch, with their words/s."""
    tokens = record.get("max_tokens", [None])[0]
    arch = SAME_ARCH.get(batch["arch"], batch["arch"])
    return [r for r in record["rows"] if not r.get("stock") and not r.get("baseline_row") and r.get("arch") == arch
            and r.get("precision") == "bf16" and r.get("max_tokens") == tokens and r.get("words_per_s") and
            r.get("target_tokens_per_step") and _same_shape(batch.get("shape", {}), r)]


def row_hours(batch, record, cards):
    """Hours of the row's ``max_update`` updates on ``cards`` of the record's card, from its words/s at the recipe
    batch (the compiled row where measured, else eager; bf16): updates x target tokens per update / (cards x
    words/s), the target tokens per update being the row's tokens per update x the measured target tokens per step
    over --max-tokens (fairseq's ``wpb``: padding and the source side are in the budget, not in words/s). Data
    parallel scaling is taken as linear (no all-reduce time): a lower bound on 8 cards. None where the record has no
    row of this arch and shape at its recipe batch (:func:`measured_rows`)."""
    rows = measured_rows(batch, record)
    if not rows or not batch.get("max_update"):
        return None
    best = max(rows, key=lambda r: (r.get("compiled", False), r["words_per_s"]))
    tokens = record["max_tokens"][0]
    target_per_update = batch["tokens_per_update"] * best["target_tokens_per_step"] / tokens
    return batch["max_update"] * target_per_update / (cards * best["words_per_s"]) / 3600


def scaled_update_freq(batch, nodes, gpus_per_node):
    world = nodes * gpus_per_node
    new = max(1, batch["update_freq"] * batch["assumed_gpus"] // world)
    exact = new * world == batch["update_freq"] * batch["assumed_gpus"]
    return new, exact


def rows(config_dir=os.path.join(ROOT, "configs")):
    paths = sorted(p for p in glob.glob(os.path.join(config_dir, "*.yaml"))
                   if not os.path.basename(p).startswith("m30k-"))  # Multi30k rows train on one CPU/GPU
    return [row_batch(p) for p in paths]


def markdown(config_dir=os.path.join(ROOT, "configs")):
    head = ["row", "max_tokens", "update_freq x GPUs (config)", "tokens per update"]
    head += [f"update_freq on {n} x {g} GPUs" for n, g in CLUSTERS]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for b in rows(config_dir):
        cells = [f"`{b['row']}`", str(b["max_tokens"]), f"{b['update_freq']} x {b['assumed_gpus']}",
                 f"{b['tokens_per_update']:,}"]
        for n, g in CLUSTERS:
            uf, exact = scaled_update_freq(b, n, g)
            cells.append(str(uf) if exact else f"{uf} (batch {uf * n * g * b['max_tokens']:,}: not exact)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def measuring_record(batch, records):
    """The record whose words/s give the row's hours, of ``records`` (one card's speed tables, newest first): the
    newest that measured the row's arch and shape compiled (what a recipe trains with, ``--compile``) at its recipe
    batch, else the newest that measured it eager; None where none has. A table cut short by its deadline (rows not
    reached, or only the eager row of an arch) does not hide an older table's row of that arch."""
    measured = [(record, measured_rows(batch, record)) for record in records]
    for record, rows in measured:
        if any(r.get("compiled") for r in rows):
            return record
    return next((record for record, rows in measured if rows), None)


def cards_markdown(config_dir=os.path.join(ROOT, "configs"), results_dir=os.path.join(ROOT, "docs", "results")):
    """Per row: the batch per card and update_freq on 1, 8 and 16 cards for the paper's tokens per update, and the
    hours on 1 and 8 cards of the newest speed table's card, from the newest of that card's tables that measured the
    row's arch and shape (its commit in the last column), or that none has measured it."""
    records = speed_records(results_dir)
    card = records[0][0] if records else None
    records = [record for c, record in records if c == card]
    hours_head = [f"hours on {n} x {card}" for n in (1, 8)] + ["speed table"] if card else \
        ["hours (no speed table yet)"]
    head = ["row", "tokens per update", "updates"] + [f"{n} card{'s' if n > 1 else ''}: --max-tokens x update_freq"
                                                     for n in CARDS] + hours_head
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for b in rows(config_dir):
        plans = {n: card_plan(b["tokens_per_update"], n, CARD_TOKENS[width(b)]) for n in CARDS}
        cells = [f"`{b['row']}`", f"{b['tokens_per_update']:,}", f"{b['max_update']:,}" if b["max_update"] else "-"]
        cells += [f"{plans[n][0]:,} x {plans[n][1]}" if plans[n] else "none exact" for n in CARDS]
        # hours only divide by the cards: the table that measured the row on one card measured it on eight
        record = measuring_record(b, records) if b.get("max_update") else None
        if not records:
            cells.append("-")
        elif record is None:
            cells += ["not measured", "not measured", "-"]
        else:
            for n in (1, 8):
                if plans[n] and plans[n][0] < MEASURED_FRACTION * record.get("max_tokens", [0])[0]:
                    # words/s at a smaller batch per card is lower (a GPU that waits for the host): not this table's
                    cells.append(f"not measured at {plans[n][0]:,} tokens per card")
                else:
                    cells.append(f"{row_hours(b, record, n):,.1f}")
            cells.append(f"`{record.get('commit', '?')}`")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(cards_markdown() if "--cards" in sys.argv[1:] else markdown())
