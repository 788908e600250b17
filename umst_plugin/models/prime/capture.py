"""What umst-inspect draws of a Prime model (:mod:`umst_plugin.inspect`): ``MultiKernelConv.gate_weights()``
(softmax(alpha), Eq. 7) of every layer and, for the chosen layer's dynamic convolution, the per-position kernels of
each cell (Eq. 6: the kernel logits its joined predictors return, softmax-normalised over the taps as the cell
does) and their mixture."""
import numpy as np

from umst_plugin.inspect.capture import Capture, InspectError, Panel, pick_head, resolve_layer, run_encoder, to_numpy


def _band(kernel, padding_l, n):
    """T x K per-position kernel -> T x T map: tap j of position i weighs position i + j - padding_l."""
    out = np.zeros((n, n), dtype=np.float32)
    for i in range(n):
        for j in range(kernel.shape[1]):
            p = i + j - padding_l
            if 0 <= p < n:
                out[i, p] += kernel[i, j]
    return out


def capture_prime(model, sample, source, layer=None, head=None):
    layers = model.encoder.layers
    convs = [getattr(l, "conv", None) if getattr(l, "has_conv", False) else None for l in layers]
    if all(c is None for c in convs):
        raise InspectError("this Prime model has no convolution branch (prime_simple): no kernel mixture to draw")
    index = resolve_layer(layer, len(layers))
    conv = convs[index]
    if conv is None:
        raise InspectError(f"layer {layer} has no convolution branch")
    logits = {}
    dynamic = conv.conv_type == "dynamic" and all(hasattr(cell, "weight_linear") for cell in conv.cells)
    if dynamic:
        # the cells' kernel logits come from one product of their joined predictors (_cell_logits), not from
        # each cell's weight_linear: capture what that method returns, on this instance only
        predict = conv._cell_logits

        def capture_logits(x):
            out = predict(x)
            for k, lg in zip(conv.kernel_sizes, out):
                logits.setdefault(k, lg.detach())
            return out
        conv._cell_logits = capture_logits
    try:
        run_encoder(model, sample)
    finally:
        if dynamic:
            del conv._cell_logits  # the class's method again
    # softmax(alpha) of every layer (Eq. 7)
    all_sizes = sorted({k for c in convs if c is not None for k in c.kernel_sizes})
    shares = np.full((len(layers), len(all_sizes)), np.nan, dtype=np.float32)
    for i, c in enumerate(convs):
        if c is None:
            continue
        g = c.gate_weights()
        g = np.ones(1, dtype=np.float32) if g is None else to_numpy(g)
        for k, w in zip(c.kernel_sizes, g):
            shares[i, all_sizes.index(k)] = w
    panels = [Panel("Prime kernel mixture softmax(alpha) (Eq. 7)", shares, [f"layer {i + 1}" for i in range(len(layers))],
                    [f"k={k}" for k in all_sizes], "encoder layer", "kernel size", annotate=True, vmax=1.0)]
    notes = []
    n = len(source.pieces)
    pieces = source.pieces
    if dynamic:
        gate = conv.gate_weights()
        gate = np.ones(1, dtype=np.float32) if gate is None else to_numpy(gate)
        mixed = np.zeros((n, n), dtype=np.float32)
        heads = conv.cells[0].num_heads
        for (k, cell), share in zip(zip(conv.kernel_sizes, conv.cells), gate):
            w = logits[k][:, 0].view(n, heads, -1)[..., :k].float().softmax(-1)  # T x H x K, as the cell does
            kernel, which = pick_head(w.transpose(0, 1), head, heads)  # -> T x K
            band = _band(to_numpy(kernel), cell.padding_l, n)
            mixed += share * band
            panels.append(Panel(f"Prime dynamic kernel k={k} per position (Eq. 6), share {share:.2f}\n"
                                f"layer {index + 1}/{len(layers)}, {which}", band, pieces, pieces,
                                "output position", "input position"))
        panels.append(Panel(f"Prime mixed kernel sum_k softmax(alpha)_k D_k per position\n"
                            f"layer {index + 1}/{len(layers)}", mixed, pieces, pieces,
                            "output position", "input position"))
    else:
        notes.append("standard (not dynamic) convolution: kernels do not depend on the position; "
                     "only the kernel-size shares are drawn")
    return Capture("prime", panels, notes)
