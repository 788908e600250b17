#!/usr/bin/env python
"""Plot per-layer encoder gradient norms over training (figure 5 of the MSC paper).

Input: the JSONL written by ``fairseq-train --arch msc... --log-encoder-grad-norms``
(default ``<save-dir>/encoder_grad_norms.jsonl``): one line per update,
``{"update": u, "loss_weight": w, "grad_norms": [layer 1, ..., layer L]}``.
Several files (e.g. a plain and an MSC run) can be given; they are drawn side by
side with a shared y axis.

Output: a PNG with one curve per selected layer ("L1", ..., "L72"), gradient
norm against update, like figure 5; and, with --heatmap, a layer x update
heat map underneath.

    python scripts/plot_grad_norms.py ckpt/encoder_grad_norms.jsonl -o fig5.png
    python scripts/plot_grad_norms.py plain.jsonl msc.jsonl --labels plain MSC -o fig5.png
"""

import argparse
import json
import math
import sys


def read_norms(path):
    updates, norms = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            record = json.loads(line)
            updates.append(int(record["update"]))
            norms.append([math.nan if v is None else float(v) for v in record["grad_norms"]])
    if not norms:
        raise SystemExit(f"{path}: no records")
    if len({len(n) for n in norms}) != 1:
        raise SystemExit(f"{path}: records have different numbers of layers")
    return updates, norms


def default_layers(num_layers, count=6):
    """Layer 1, the top layer, and evenly spaced layers between (1-based)."""
    if num_layers <= count:
        return list(range(1, num_layers + 1))
    step = (num_layers - 1) / (count - 1)
    return sorted({1 + round(i * step) for i in range(count)})


def smooth(values, window):
    if window <= 1:
        return values
    out, acc, buf = [], 0.0, []
    for v in values:
        buf.append(v)
        acc += v
        if len(buf) > window:
            acc -= buf.pop(0)
        out.append(acc / len(buf))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jsonl", nargs="+", help="encoder_grad_norms.jsonl file(s)")
    parser.add_argument("-o", "--output", required=True, help="output PNG path")
    parser.add_argument("--labels", nargs="+", help="one title per input file")
    parser.add_argument("--layers", type=int, nargs="+",
                        help="1-based layers to draw (default: 6 layers from L1 to the top)")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window in updates")
    parser.add_argument("--log-y", action="store_true", help="logarithmic y axis")
    parser.add_argument("--heatmap", action="store_true", help="add a layer x update heat map")
    args = parser.parse_args(argv)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    runs = [read_norms(p) for p in args.jsonl]
    labels = args.labels or args.jsonl
    if len(labels) != len(runs):
        raise SystemExit("--labels needs one label per input file")
    rows = 2 if args.heatmap else 1
    fig, axes = plt.subplots(rows, len(runs), figsize=(5.5 * len(runs), 3.8 * rows),
                             squeeze=False, sharey="row")
    for col, ((updates, norms), label) in enumerate(zip(runs, labels)):
        num_layers = len(norms[0])
        layers = args.layers or default_layers(num_layers)
        bad = [l for l in layers if not 1 <= l <= num_layers]
        if bad:
            raise SystemExit(f"layers {bad} outside 1..{num_layers}")
        ax = axes[0][col]
        for layer in layers:
            ax.plot(updates, smooth([n[layer - 1] for n in norms], args.smooth), label=f"L{layer}",
                    linewidth=1.2)
        ax.set_title(f"{label} ({num_layers}-layer encoder)")
        ax.set_xlabel("update")
        ax.set_ylabel("gradient norm")
        if args.log_y:
            ax.set_yscale("log")
        ax.legend(fontsize=8, ncol=2)
        if args.heatmap:
            hm = axes[1][col]
            data = np.array(norms, dtype=float).T  # layers x updates
            if args.log_y:
                data = np.log10(np.where(data > 0, data, np.nan))
            im = hm.imshow(data, aspect="auto", origin="lower", interpolation="nearest",
                           extent=[updates[0] - 0.5, updates[-1] + 0.5, 0.5, num_layers + 0.5])
            hm.set_xlabel("update")
            hm.set_ylabel("encoder layer")
            fig.colorbar(im, ax=hm, label="log10 norm" if args.log_y else "norm")
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
