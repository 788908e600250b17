"""What umst-inspect draws of an MSC model (:mod:`umst_plugin.inspect`): ``FeatureFusion.record`` keeps the gates
``g`` of Eq. 12 (encoder) and, when the sample has a target, Eq. 13 (decoder, teacher forcing)."""
import torch

from umst_plugin.inspect.capture import Capture, InspectError, Panel, model_inputs, run_encoder, to_numpy


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
                model(**model_inputs(model, sample))
            else:
                run_encoder(model, sample)
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
                    to_numpy(torch.stack(gates)), rows, source.pieces, "layer", "source subword",
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
                            to_numpy(torch.stack(dgates)), drows, tgt_labels[:n_tgt], "decoder layer",
                            "target input (teacher forcing)", annotate=n_tgt <= 24, vmax=1.0, cmap="coolwarm"))
    elif not has_target:
        notes.append("no target (--sentence): decoder block-collaboration gates not drawn")
    return Capture("msc", panels, notes)
