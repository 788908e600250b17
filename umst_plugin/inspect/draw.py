"""Drawing for umst-inspect: matplotlib's object API (a ``Figure`` rendered by Agg), no pyplot state."""
import logging
import math
import textwrap

import numpy as np

logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's logging setup would show its font search


def _font(n, big=10.0, small=5.0, budget=170.0):
    """Tick label size for n labels along one axis."""
    return max(small, min(big, budget / max(n, 1)))


def _short(label, width=12):
    return label if len(label) <= width else label[: width - 1] + "…"


def draw_scales(ax, source):
    """Subword pieces (bottom), the words they form (middle, lines = G_{b->w}), and the dependency
    arcs between words (top, head -> dependent; the arcs A_p is built from)."""
    pieces, words, token_word, heads = source.pieces, source.words, source.token_word, source.heads
    n = len(pieces)
    fs = _font(n, big=10, small=5.5, budget=220)
    xs_piece = np.arange(n, dtype=float)
    xs_word = np.array([xs_piece[[i for i, w in enumerate(token_word) if w == wi]].mean()
                        for wi in range(len(words))])
    y_piece, y_word = 0.0, 1.3
    box = dict(boxstyle="round,pad=0.25", linewidth=0.6)
    for i, p in enumerate(pieces):
        ax.text(xs_piece[i], y_piece, _short(p), ha="center", va="center", fontsize=fs, rotation=90 if n > 24 else 0,
                bbox={**box, "facecolor": "#fde9c9", "edgecolor": "#c98a2a"})
        ax.plot([xs_piece[i], xs_word[token_word[i]]], [y_piece + 0.22, y_word - 0.22], color="#999999", lw=0.8)
    for wi, w in enumerate(words):
        ax.text(xs_word[wi], y_word, _short(w, 16), ha="center", va="center", fontsize=fs,
                bbox={**box, "facecolor": "#d6e8f7", "edgecolor": "#3a78b5"})
    top = y_word + 0.5
    base = y_word + 0.3
    for dep, head in enumerate(heads):
        if dep == len(words) - 1 and words[dep] == "</s>":
            continue  # the </s> word: head 0 by construction, not a parse
        if head == 0:
            ax.annotate("root", xy=(xs_word[dep], base), xytext=(xs_word[dep], base + 0.9), ha="center",
                        fontsize=fs, color="#7a2f8f",
                        arrowprops=dict(arrowstyle="->", color="#7a2f8f", lw=1.0))
            top = max(top, base + 1.1)
            continue
        h = head - 1
        x0, x1 = xs_word[h], xs_word[dep]
        height = 0.35 + 0.28 * abs(dep - h)
        t = np.linspace(0, 1, 40)
        ax.plot(x0 + (x1 - x0) * t, base + height * np.sin(np.pi * t), color="#7a2f8f", lw=1.0)
        ax.annotate("", xy=(x1, base), xytext=(x1 + (x0 - x1) * 0.02, base + height * np.sin(np.pi * 0.02) + 0.05),
                    arrowprops=dict(arrowstyle="->", color="#7a2f8f", lw=1.0))
        top = max(top, base + height + 0.2)
    ax.set_xlim(-0.8, n - 0.2)
    ax.set_ylim(y_piece - (0.9 if n > 24 else 0.5), top)
    ax.text(-0.75, y_piece, "subwords", ha="right", va="center", fontsize=9, color="#c98a2a")
    ax.text(-0.75, y_word, "words", ha="right", va="center", fontsize=9, color="#3a78b5")
    ax.text(-0.75, base + 0.4, "dependencies", ha="right", va="center", fontsize=9, color="#7a2f8f")
    ax.axis("off")
    ax.set_title("source at its scales: subword pieces -> words (G_b->w) -> dependency tree (A_p)", fontsize=11)


def draw_heatmap(fig, ax, panel):
    m = np.asarray(panel.matrix, dtype=float)
    masked = np.ma.masked_invalid(m)
    vmax = panel.vmax if panel.vmax is not None else (np.nanmax(m) if np.isfinite(m).any() else 1.0)
    im = ax.imshow(masked, cmap=panel.cmap, vmin=panel.vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    rows, cols = panel.rows, panel.cols
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels([_short(c) for c in cols], rotation=90, fontsize=_font(len(cols)))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([_short(r, 18) for r in rows], fontsize=_font(len(rows)))
    ax.tick_params(length=2, pad=1)
    if panel.col_label:
        ax.set_xlabel(panel.col_label, fontsize=8)
    if panel.row_label:
        ax.set_ylabel(panel.row_label, fontsize=8)
    if panel.annotate and m.size <= 400:
        for (r, c), v in np.ndenumerate(m):
            if np.isfinite(v):
                red, green, blue, _ = im.cmap(im.norm(v))
                dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
                ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=min(8, _font(len(cols), budget=120)),
                        color="white" if dark else "black")
    title = "\n".join(textwrap.fill(line, 52) for line in panel.title.split("\n"))
    ax.set_title(title, fontsize=9)
    cbar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    cbar.ax.tick_params(labelsize=7)


def make_figure(source, panels, heading, ncols=3):
    """The whole picture: the scales diagram on top, then one heatmap per panel."""
    from matplotlib.figure import Figure

    n = len(source.pieces)
    ncols = max(1, min(ncols, len(panels)))
    nrows = math.ceil(len(panels) / ncols) if panels else 0
    cell = max(4.2, min(7.0, 0.22 * n + 2.2))
    width = max(12.0, 0.62 * n + 2.5, ncols * (cell + 1.0))
    diagram_h = 3.2 + 0.06 * n
    height = diagram_h + nrows * (cell + 1.4) + 0.6 + 0.22 * heading.count("\n")  # 12-point heading lines
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    gs = fig.add_gridspec(1 + nrows, ncols, height_ratios=[diagram_h] + [cell + 1.4] * nrows)
    draw_scales(fig.add_subplot(gs[0, :]), source)
    for i, panel in enumerate(panels):
        draw_heatmap(fig, fig.add_subplot(gs[1 + i // ncols, i % ncols]), panel)
    fig.suptitle(heading, fontsize=12)
    return fig
