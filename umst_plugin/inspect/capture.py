"""What a trained model does with one sentence, read from its own tensors.

One ``capture_*`` function per architecture family. Each runs the model's encoder once, in
evaluation mode and without gradients, on a one-sentence sample built by the task, and returns
``Panel`` s (matrices with their row/column labels) for :mod:`umst_plugin.inspect.draw`.

How the tensors are read, per family (nothing is re-derived from parameters):

* UMST: a forward pre-hook on the chosen layer's ``RectifiedSelfAttention`` keeps its inputs
  (subword stream, word stream, graphs); the module's own ``attention_maps`` gives ATTN1, ATTN2 and
  the fused map, and ``umst_graphs.upsample_attention_map`` the up-sampled ATTN2'.
* TranSFormer: ``WidthChangingAttention.record`` (cga fusion) keeps the cross-granularity weights;
  with ``linear-attention`` fusion, fairseq's attention is asked for its weights (see
  ``_ask_for_weights``).
* MSMSA and fairseq's transformer: the self-attention is asked for its weights, per head where
  the module can return them (``need_head_weights``).
* MSC: ``FeatureFusion.record`` keeps the gates ``g`` of Eq. 12 (encoder) and, when the sample has
  a target, Eq. 13 (decoder, teacher forcing).
* Prime: ``MultiKernelConv.gate_weights()`` (softmax(alpha), Eq. 7) and a forward hook on each
  dynamic-convolution cell's ``weight_linear`` (the per-position kernel logits of Eq. 6,
  softmax-normalised over the taps as the cell does).
"""
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch


class InspectError(Exception):
    """A user-facing error of umst-inspect (bad index, unknown architecture, missing file...)."""


@dataclass
class Panel:
    title: str
    matrix: np.ndarray  # rows x cols
    rows: List[str]
    cols: List[str]
    row_label: str = ""
    col_label: str = ""
    annotate: bool = False
    cmap: str = "viridis"
    vmin: Optional[float] = 0.0
    vmax: Optional[float] = None


@dataclass
class Capture:
    family: str
    panels: List[Panel] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


def _np(t):
    return t.detach().float().cpu().numpy()


def resolve_layer(layer, n_layers, what="encoder layers"):
    """1-based ``--layer`` (None = last) -> 0-based index, with a clear error."""
    if layer is None:
        return n_layers - 1
    if not 1 <= layer <= n_layers:
        raise InspectError(f"--layer {layer} is out of range: the model has {n_layers} {what} (1..{n_layers})")
    return layer - 1


def pick_head(maps, head, n_heads):
    """maps: H x R x C -> (R x C, description) for --head (1-based) or the mean over heads."""
    if head is None:
        return maps.mean(0), f"mean of {n_heads} heads"
    if not 1 <= head <= n_heads:
        raise InspectError(f"--head {head} is out of range: this attention has {n_heads} heads (1..{n_heads})")
    return maps[head - 1], f"head {head}/{n_heads}"


def family_of(model):
    """The architecture family of a loaded model, by its encoder class; None if unknown."""
    from fairseq.models.transformer import TransformerEncoderBase

    from umst_plugin.models.msc import MSCEncoder
    from umst_plugin.models.msmsa import MSMSAEncoder
    from umst_plugin.models.prime import PrimeEncoder
    from umst_plugin.models.transformer_sf import SlowFastEncoder
    from umst_plugin.models.umst import UMSTEncoder

    encoder = getattr(model, "encoder", None)
    for cls, name in ((UMSTEncoder, "umst"), (SlowFastEncoder, "transformer_sf"), (MSMSAEncoder, "msmsa"),
                      (MSCEncoder, "msc"), (PrimeEncoder, "prime")):
        if isinstance(encoder, cls):
            return name
    if type(encoder).__module__.startswith("fairseq.") and isinstance(encoder, TransformerEncoderBase):
        return "transformer"
    return None


FAMILIES = ("umst", "transformer_sf", "msmsa", "msc", "prime", "transformer")


def encoder_inputs(model, sample):
    from umst_plugin.batches import encoder_inputs as _inputs

    return _inputs(model, sample)


def _run_encoder(model, sample):
    with torch.no_grad():
        return model.encoder(**encoder_inputs(model, sample))


# ---------------------------------------------------------------------------- UMST


def capture_umst(model, sample, source, layer=None, head=None):
    from umst_plugin.modules.umst.graphs import upsample_attention_map

    layers = model.encoder.layers
    index = resolve_layer(layer, len(layers))
    rsan = layers[index].self_attn
    seen = {}
    handle = rsan.register_forward_pre_hook(lambda module, args: seen.setdefault("args", args))
    try:
        _run_encoder(model, sample)
    finally:
        handle.remove()
    x, x_word, graphs = seen["args"]
    with torch.no_grad():
        a1, a2, fused = rsan.attention_maps(x, x_word, graphs)
        a2_up = upsample_attention_map(a2, graphs, normalize=rsan.upsample_norm == "row")
    n_heads = rsan.num_heads
    where = f"layer {index + 1}/{len(layers)}"
    pieces, words = source.pieces, source.words
    panels = []
    for name, maps, labels in (("ATTN1 (subword self-attention)", a1, pieces),
                               ("ATTN2 (word self-attention)", a2, words),
                               ("ATTN2' (word map up-sampled to subwords)", a2_up, pieces),
                               ("fused rectified attention (ATTN1 + ATTN2')/2", fused, pieces)):
        matrix, which = pick_head(maps[0], head, n_heads)
        panels.append(Panel(f"UMST {name}\n{where}, {which}", _np(matrix), labels, labels,
                            row_label="query", col_label="key"))
    notes = []
    if rsan.rel_keys is not None:
        notes.append("relative positions: ATTN1 includes the relative key term; the relative value term "
                     "is not a map and is not drawn")
    return Capture("umst", panels, notes)


# ---------------------------------------------------------------------------- fairseq attention weights


def _ask_for_weights(module, store):
    """Make a fairseq-style attention module (called with keyword arguments) return its weights,
    per head where it can, and keep them in ``store``; returns the hook handles."""

    def pre(mod, args, kwargs):
        kwargs = dict(kwargs)
        kwargs["need_weights"] = True
        kwargs["need_head_weights"] = True
        return args, kwargs

    def post(mod, args, kwargs, output):
        store.append(output[1].detach())

    return [module.register_forward_pre_hook(pre, with_kwargs=True),
            module.register_forward_hook(post, with_kwargs=True)]


def _fairseq_mha_per_head(weights, n_heads):
    """fairseq MultiheadAttention with need_head_weights returns H x B x T x S (B x T x S if it
    averaged the heads itself): -> (H' x T x S of sentence 0, whether per head)."""
    if weights.dim() == 4:
        return weights[:, 0], True
    return weights[0].unsqueeze(0), False


def _encoder_self_attention(model, sample, layer):
    """Run the encoder once, keeping the chosen layer's self-attention weights:
    -> (layer index, number of layers, the attention module, its weights)."""
    layers = model.encoder.layers
    index = resolve_layer(layer, len(layers))
    attn = layers[index].self_attn
    store = []
    handles = _ask_for_weights(attn, store)
    try:
        _run_encoder(model, sample)
    finally:
        for h in handles:
            h.remove()
    return index, len(layers), attn, store[0]


def capture_transformer(model, sample, source, layer=None, head=None):
    index, n_layers, attn, weights = _encoder_self_attention(model, sample, layer)
    maps, per_head = _fairseq_mha_per_head(weights, attn.num_heads)
    notes = []
    if per_head:
        matrix, which = pick_head(maps, head, attn.num_heads)
    else:
        matrix, which = maps[0], f"mean of {attn.num_heads} heads"
        if head is not None:
            notes.append("this attention returned head-averaged weights only; --head ignored")
    pieces = source.pieces
    title = f"transformer encoder self-attention\nlayer {index + 1}/{n_layers}, {which}"
    return Capture("transformer", [Panel(title, _np(matrix), pieces, pieces, "query", "key")], notes)


# ---------------------------------------------------------------------------- MSMSA


def _scale_width(scale, n_tokens):
    if scale.kind == "fixed":
        return f"width {scale.value}"
    if scale.kind == "relative":
        half = n_tokens // (2 * scale.value)
        return f"width {2 * half + 1}"
    return "global"


def capture_msmsa(model, sample, source, layer=None, head=None):
    index, n_layers, attn, weights = _encoder_self_attention(model, sample, layer)
    weights = weights[0]  # H x T x T (MultiScaleSelfAttention: B x H x T x S)
    n_tokens = len(source.pieces)
    heads = range(attn.num_heads) if head is None else [resolve_head(head, attn.num_heads)]
    pieces = source.pieces
    panels = []
    for h in heads:
        scale = attn.head_scales[h]
        title = (f"MSMSA head {h + 1}/{attn.num_heads}: scale {scale}, {_scale_width(scale, n_tokens)}\n"
                 f"layer {index + 1}/{n_layers}")
        panels.append(Panel(title, _np(weights[h]), pieces, pieces, "query", "key"))
    return Capture("msmsa", panels)


def resolve_head(head, n_heads):
    if not 1 <= head <= n_heads:
        raise InspectError(f"--head {head} is out of range: this attention has {n_heads} heads (1..{n_heads})")
    return head - 1


# ---------------------------------------------------------------------------- TranSFormer


def _fast_labels(encoder, sample, source):
    chars = encoder.char_table(sample["net_input"]["src_tokens"])
    if encoder.fast_input != "char":
        return list(source.pieces), "subword (fast branch)"
    labels = []
    for c in chars.chars[0].tolist():
        if c == 0:
            continue
        s = encoder.char_table.char_string(c)
        labels.append("␣" if s == " " else s)
    return labels, "character"


def capture_transformer_sf(model, sample, source, layer=None, head=None):
    encoder = model.encoder
    layers = encoder.stack.layers
    fused = [i for i, l in enumerate(layers) if l.slow_fusion is not None or l.fast_fusion is not None]
    if not fused:
        raise InspectError("this TranSFormer has no cross-granularity fusion layer (--sf-interaction-layers none)")
    if layer is None:
        index = fused[-1]
    else:
        index = resolve_layer(layer, len(layers))
        if index not in fused:
            raise InspectError(f"layer {layer} has no cross-granularity fusion; layers with fusion: "
                               f"{', '.join(str(i + 1) for i in fused)}")
    fast_labels, fast_name = _fast_labels(encoder, sample, source)
    pieces = source.pieces
    stores, handles, modules = {}, [], []
    for receiver, fusion in (("slow", layers[index].slow_fusion), ("fast", layers[index].fast_fusion)):
        if fusion is None:
            continue
        if fusion.kind == "cga":
            fusion.attn.record = stores.setdefault(receiver, [])
            modules.append(fusion.attn)
        elif fusion.kind == "linear-attention":
            handles += _ask_for_weights(fusion.attn, stores.setdefault(receiver, []))
    if not stores:
        raise InspectError(f"--sf-fusion {layers[index].slow_fusion.kind if layers[index].slow_fusion else '?'} "
                           "has no attention between the branches (only resampling); nothing to draw")
    try:
        _run_encoder(model, sample)
    finally:
        for m in modules:
            m.record = None
        for h in handles:
            h.remove()
    panels = []
    for receiver, store in stores.items():
        weights = store[0]
        if isinstance(weights, torch.Tensor) and weights.dim() == 4 and weights.size(0) == 1:
            maps = weights[0]  # WidthChangingAttention: B x H x Lq x Lk
        else:
            maps, _ = _fairseq_mha_per_head(weights, 0)
        n_heads = maps.size(0)
        matrix, which = pick_head(maps, head, n_heads)
        if receiver == "slow":
            rows, cols, rl, cl = pieces, fast_labels, "subword (slow, query)", f"{fast_name} (key)"
            name = f"subword -> {fast_name}"
        else:
            rows, cols, rl, cl = fast_labels, pieces, f"{fast_name} (query)", "subword (slow, key)"
            name = f"{fast_name} -> subword"
        title = f"TranSFormer cross-granularity attention: {name}\nlayer {index + 1}/{len(layers)}, {which}"
        panels.append(Panel(title, _np(matrix), rows, cols, rl, cl))
    return Capture("transformer_sf", panels)


# ---------------------------------------------------------------------------- MSC


def capture_msc(model, sample, source, layer=None, head=None):
    encoder = model.encoder
    fusions = [l.fusion for l in encoder.layers]
    if all(f is None or f.gate_proj is None for f in fusions):
        why = "--msc-fusion add" if any(f is not None for f in fusions) else "no context attention"
        raise InspectError(f"this MSC model has no gates to draw ({why})")
    stores = []
    for f in fusions:
        stores.append([])
        if f is not None:
            f.record = stores[-1]
    dec_fusions = [getattr(l, "fusion", None) for l in getattr(model.decoder, "layers", [])]
    dec_stores = [[] for _ in dec_fusions]
    has_target = "prev_output_tokens" in sample["net_input"]
    if has_target:
        for f, s in zip(dec_fusions, dec_stores):
            if f is not None:
                f.record = s
    try:
        with torch.no_grad():
            if has_target:
                model(**_model_inputs(model, sample))
            else:
                _run_encoder(model, sample)
    finally:
        for f in fusions + dec_fusions:
            if f is not None:
                f.record = None
    m = encoder.layers_per_block
    rows, gates = [], []
    for i, store in enumerate(stores):
        if store:
            rows.append(f"block {i // m + 1} layer {i % m + 1}")
            gates.append(store[0][:, 0].mean(-1))  # T x B x C -> T: channel mean
    panels = [Panel("MSC encoder gates g (Eq. 12), mean over channels\n"
                    "g -> 1: self-attention, g -> 0: attention over the context C^{n-1}",
                    _np(torch.stack(gates)), rows, source.pieces, "layer", "source subword",
                    annotate=len(source.pieces) <= 24, vmax=1.0, cmap="coolwarm")]
    notes = []
    if has_target and any(dec_stores):
        tgt = sample["target"][0]
        tgt_labels = [model.decoder.dictionary[int(t)] for t in sample["net_input"]["prev_output_tokens"][0]]
        n_tgt = int(tgt.ne(model.decoder.dictionary.pad()).sum())
        drows, dgates = [], []
        for n, store in enumerate(dec_stores):
            if store:
                drows.append(f"layer {n + 1} (block {n + 1})")
                dgates.append(store[0][:n_tgt, 0].mean(-1))
        panels.append(Panel("MSC decoder block-collaboration gates (Eq. 13), mean over channels\n"
                            "g -> 1: attention over block B^n, g -> 0: over the context C^n",
                            _np(torch.stack(dgates)), drows, tgt_labels[:n_tgt], "decoder layer",
                            "target input (teacher forcing)", annotate=n_tgt <= 24, vmax=1.0, cmap="coolwarm"))
    elif not has_target:
        notes.append("no target (--sentence): decoder block-collaboration gates not drawn")
    return Capture("msc", panels, notes)


def _model_inputs(model, sample):
    from umst_plugin.batches import model_inputs

    return model_inputs(model, sample)


# ---------------------------------------------------------------------------- Prime


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
        _run_encoder(model, sample)
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
        g = np.ones(1, dtype=np.float32) if g is None else _np(g)
        for k, w in zip(c.kernel_sizes, g):
            shares[i, all_sizes.index(k)] = w
    panels = [Panel("Prime kernel mixture softmax(alpha) (Eq. 7)", shares, [f"layer {i + 1}" for i in range(len(layers))],
                    [f"k={k}" for k in all_sizes], "encoder layer", "kernel size", annotate=True, vmax=1.0)]
    notes = []
    n = len(source.pieces)
    pieces = source.pieces
    if dynamic:
        gate = conv.gate_weights()
        gate = np.ones(1, dtype=np.float32) if gate is None else _np(gate)
        mixed = np.zeros((n, n), dtype=np.float32)
        heads = conv.cells[0].num_heads
        for (k, cell), share in zip(zip(conv.kernel_sizes, conv.cells), gate):
            w = logits[k][:, 0].view(n, heads, -1)[..., :k].float().softmax(-1)  # T x H x K, as the cell does
            kernel, which = pick_head(w.transpose(0, 1), head, heads)  # -> T x K
            band = _band(_np(kernel), cell.padding_l, n)
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


CAPTURES = {
    "umst": capture_umst,
    "transformer_sf": capture_transformer_sf,
    "msmsa": capture_msmsa,
    "msc": capture_msc,
    "prime": capture_prime,
    "transformer": capture_transformer,
}
