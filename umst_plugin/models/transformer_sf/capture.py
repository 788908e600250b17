"""What umst-inspect draws of a TranSFormer model (:mod:`umst_plugin.inspect`): the cross-granularity
attention of the chosen fusion layer. ``WidthChangingAttention.record`` (cga fusion) keeps the weights; with
``linear-attention`` fusion, fairseq's attention is asked for its weights (``ask_for_weights``)."""
import torch

from umst_plugin.inspect.capture import (Capture, InspectError, Panel, ask_for_weights, fairseq_mha_per_head, pick_head,
                                         resolve_layer, run_encoder, to_numpy)


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
            handles += ask_for_weights(fusion.attn, stores.setdefault(receiver, []))
    if not stores:
        raise InspectError(f"--sf-fusion {layers[index].slow_fusion.kind if layers[index].slow_fusion else '?'} "
                           "has no attention between the branches (only resampling); nothing to draw")
    try:
        run_encoder(model, sample)
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
            maps, _ = fairseq_mha_per_head(weights, 0)
        n_heads = maps.size(0)
        matrix, which = pick_head(maps, head, n_heads)
        if receiver == "slow":
            rows, cols, rl, cl = pieces, fast_labels, "subword (slow, query)", f"{fast_name} (key)"
            name = f"subword -> {fast_name}"
        else:
            rows, cols, rl, cl = fast_labels, pieces, f"{fast_name} (query)", "subword (slow, key)"
            name = f"{fast_name} -> subword"
        title = f"TranSFormer cross-granularity attention: {name}\nlayer {index + 1}/{len(layers)}, {which}"
        panels.append(Panel(title, to_numpy(matrix), rows, cols, rl, cl))
    return Capture("transformer_sf", panels)
