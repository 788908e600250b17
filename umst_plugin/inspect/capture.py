"""What a trained model does with one sentence, read from its own tensors.

Each encoder family has its capture function, registered with the family (``Family.capture``, in its own
``umst_plugin/models/<family>/capture.py``); fairseq's transformer's is :func:`capture_transformer` here. A
capture runs the model's encoder once, in evaluation mode and without gradients, on a one-sentence sample built by
the task, and returns ``Panel`` s (matrices with their row/column labels) for :mod:`umst_plugin.inspect.draw`.
This module holds what the captures share: the panels, the errors, the layer and head choice, running the
encoder, asking a fairseq-style attention for its weights. Nothing is re-derived from parameters: each family's
module says which tensors it reads.
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


def to_numpy(t):
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
    return maps[resolve_head(head, n_heads)], f"head {head}/{n_heads}"


def resolve_head(head, n_heads):
    """1-based ``--head`` -> 0-based index, with a clear error."""
    if not 1 <= head <= n_heads:
        raise InspectError(f"--head {head} is out of range: this attention has {n_heads} heads (1..{n_heads})")
    return head - 1


def family_of(model):
    """The name of a loaded model's encoder family (by its encoder class, from the family registry),
    "transformer" for fairseq's own transformer encoder; None if unknown."""
    from fairseq.models.transformer import TransformerEncoderBase

    from umst_plugin import families

    encoder = getattr(model, "encoder", None)
    for family in families.all_families():
        if isinstance(encoder, family.encoder):
            return family.name
    if type(encoder).__module__.startswith("fairseq.") and isinstance(encoder, TransformerEncoderBase):
        return "transformer"
    return None


def known_families():
    """Every family a checkpoint can be inspected as: the registered ones, then fairseq's transformer."""
    from umst_plugin import families

    return tuple(f.name for f in families.all_families() if f.capture is not None) + ("transformer",)


def capture_for(family):
    """The capture function of the family named ``family`` (a name :func:`family_of` returns)."""
    from umst_plugin import families

    return capture_transformer if family == "transformer" else families.get(family).capture


def encoder_inputs(model, sample):
    from umst_plugin.batches import encoder_inputs as _inputs

    return _inputs(model, sample)


def run_encoder(model, sample):
    with torch.no_grad():
        return model.encoder(**encoder_inputs(model, sample))


# ---------------------------------------------------------------------------- fairseq attention weights


def ask_for_weights(module, store):
    """Make a fairseq-style attention module (called with keyword arguments) return its weights,
    per head where it can, and keep them in ``store``; returns the hook handles.

    fairseq's ``MultiheadAttention`` answers ``need_head_weights`` on its own path only: its fast path (torch's
    ``F.multi_head_attention_forward``, taken outside incremental decoding) returns the mean over heads whatever
    it is asked. While asked, the module runs its own path, through the switch fairseq has for leaving the fast
    one (``skip_embed_dim_check``): the same function, its weights per head."""
    fast_path = {}

    def pre(mod, args, kwargs):
        kwargs = dict(kwargs)
        kwargs["need_weights"] = True
        kwargs["need_head_weights"] = True
        if hasattr(mod, "skip_embed_dim_check"):
            fast_path[mod] = mod.skip_embed_dim_check
            mod.skip_embed_dim_check = True
        return args, kwargs

    def post(mod, args, kwargs, output):
        if mod in fast_path:
            mod.skip_embed_dim_check = fast_path.pop(mod)
        store.append(output[1].detach())

    return [module.register_forward_pre_hook(pre, with_kwargs=True),
            module.register_forward_hook(post, with_kwargs=True)]


def fairseq_mha_per_head(weights, n_heads):
    """fairseq MultiheadAttention with need_head_weights returns H x B x T x S (B x T x S if it
    averaged the heads itself): -> (H' x T x S of sentence 0, whether per head)."""
    if weights.dim() == 4:
        return weights[:, 0], True
    return weights[0].unsqueeze(0), False


def encoder_self_attention(model, sample, layer):
    """Run the encoder once, keeping the chosen layer's self-attention weights:
    -> (layer index, number of layers, the attention module, its weights)."""
    layers = model.encoder.layers
    index = resolve_layer(layer, len(layers))
    attn = layers[index].self_attn
    store = []
    handles = ask_for_weights(attn, store)
    try:
        run_encoder(model, sample)
    finally:
        for h in handles:
            h.remove()
    return index, len(layers), attn, store[0]


def capture_transformer(model, sample, source, layer=None, head=None):
    """fairseq's transformer: the chosen layer's self-attention is asked for its weights, per head where the
    module can return them (``need_head_weights``)."""
    index, n_layers, attn, weights = encoder_self_attention(model, sample, layer)
    maps, per_head = fairseq_mha_per_head(weights, attn.num_heads)
    notes = []
    if per_head:
        matrix, which = pick_head(maps, head, attn.num_heads)
    else:
        matrix, which = maps[0], f"mean of {attn.num_heads} heads"
        if head is not None:
            notes.append("this attention returned head-averaged weights only; --head ignored")
    pieces = source.pieces
    title = f"transformer encoder self-attention\nlayer {index + 1}/{n_layers}, {which}"
    return Capture("transformer", [Panel(title, to_numpy(matrix), pieces, pieces, "query", "key")], notes)


def model_inputs(model, sample):
    from umst_plugin.batches import model_inputs

    return model_inputs(model, sample)
