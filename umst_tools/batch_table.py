"""The effective batch of every WMT table row, and the update_freq ``scripts/train.sh`` uses on N nodes x G GPUs.

A row's config (``configs/ROW.yaml``) states the GPU count its batch assumes (``distributed_world_size``), its
``update_freq`` and ``max_tokens``: tokens per update = max_tokens x update_freq x GPUs. train.sh keeps that
product on another number of GPUs by scaling update_freq (``update_freq x assumed / (nodes x gpus)``, at least 1).

    python -m umst_tools.batch_table            # the markdown table of docs/wmt-on-gpus.md
"""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTERS = ((1, 8), (2, 8))  # (nodes, GPUs per node) of the sbatch scripts


def _value(text, section, key):
    """A scalar or one-element list under ``section:`` in a YAML file (no YAML library: fairseq-free, fast)."""
    block = re.search(rf"^{section}:\n((?:[ \t]+.*\n?)+)", text, flags=re.M)
    if not block:
        return None
    m = re.search(rf"^[ \t]+{key}:[ \t]*\[?([0-9]+)\]?", block.group(1), flags=re.M)
    return int(m.group(1)) if m else None


def row_batch(config_path):
    with open(config_path) as f:
        text = f.read()
    gpus = _value(text, "distributed_training", "distributed_world_size") or 1
    update_freq = _value(text, "optimization", "update_freq") or 1
    max_tokens = _value(text, "dataset", "max_tokens")
    return dict(row=os.path.basename(config_path)[:-5], assumed_gpus=gpus, update_freq=update_freq,
                max_tokens=max_tokens, tokens_per_update=max_tokens * update_freq * gpus if max_tokens else None)


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


if __name__ == "__main__":
    print(markdown())
