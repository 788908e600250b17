"""What umst-inspect draws of a UMST model (:mod:`umst_plugin.inspect`): a forward pre-hook on the chosen
layer's ``RectifiedSelfAttention`` keeps its inputs (subword stream, word stream, graphs); the module's own
``attention_maps`` gives ATTN1, ATTN2 and the fused map, and ``graphs.upsample_attention_map`` the up-sampled
ATTN2'."""
import torch

from umst_plugin.inspect.capture import Capture, Panel, pick_head, resolve_layer, run_encoder, to_numpy
from umst_plugin.modules.umst.graphs import upsample_attention_map


def capture_umst(model, sample, source, layer=None, head=None):
    layers = model.encoder.layers
    index = resolve_layer(layer, len(layers))
    rsan = layers[index].self_attn
    seen = {}
    handle = rsan.register_forward_pre_hook(lambda module, args: seen.setdefault("args", args))
    try:
        run_encoder(model, sample)
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
        panels.append(Panel(f"UMST {name}\n{where}, {which}", to_numpy(matrix), labels, labels,
                            row_label="query", col_label="key"))
    notes = []
    if rsan.rel_keys is not None:
        notes.append("relative positions: ATTN1 includes the relative key term; the relative value term "
                     "is not a map and is not drawn")
    return Capture("umst", panels, notes)
