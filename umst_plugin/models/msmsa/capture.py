"""What umst-inspect draws of an MSMSA model (:mod:`umst_plugin.inspect`): the chosen layer's self-attention
is asked for its weights, per head (``need_head_weights``), one panel per head with its scale and window."""
from umst_plugin.inspect.capture import Capture, Panel, encoder_self_attention, resolve_head, to_numpy


def _scale_width(scale, n_tokens):
    if scale.kind == "fixed":
        return f"width {scale.value}"
    if scale.kind == "relative":
        half = n_tokens // (2 * scale.value)
        return f"width {2 * half + 1}"
    return "global"


def capture_msmsa(model, sample, source, layer=None, head=None):
    index, n_layers, attn, weights = encoder_self_attention(model, sample, layer)
    weights = weights[0]  # H x T x T (MultiScaleSelfAttention: B x H x T x S)
    n_tokens = len(source.pieces)
    heads = range(attn.num_heads) if head is None else [resolve_head(head, attn.num_heads)]
    pieces = source.pieces
    panels = []
    for h in heads:
        scale = attn.head_scales[h]
        title = (f"MSMSA head {h + 1}/{attn.num_heads}: scale {scale}, {_scale_width(scale, n_tokens)}\n"
                 f"layer {index + 1}/{n_layers}")
        panels.append(Panel(title, to_numpy(weights[h]), pieces, pieces, "query", "key"))
    return Capture("msmsa", panels)
