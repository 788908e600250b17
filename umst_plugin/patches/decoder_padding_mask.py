"""Patch: fairseq's transformer decoder builds its self-attention padding mask in training without asking the device.

``TransformerDecoderBase.extract_features_scriptable`` builds the self-attention padding mask only ``if
self.cross_self_attention or prev_output_tokens.eq(self.padding_idx).any()``: a host-device sync on every call,
training included (the one sync per update left in the transformer, UMST, TranSFormer, MSMSA and Prime after the
plugin's own were removed), and a ``None`` mask for a batch without target padding, which ``--compile`` compiles
the decoder layer again for.

``install()`` (on plugin import) replaces it with the same computation that, without an incremental state (training,
validation, scoring), builds the mask every time. A mask with no padding position masks nothing (the attention
adds zeros to the causal mask), so the outputs are the original's. Incremental decoding runs fairseq's own
function, its test included: there the key padding mask is carried from step to step in the attention's state,
which this patch leaves as fairseq keeps it. Everything else is fairseq's code as it is in fairseq-fixed
0.12.3.1.
"""
from typing import Dict, List, Optional

from torch import Tensor

from umst_plugin.patches import wrap

TARGET = "fairseq.models.transformer.transformer_decoder.TransformerDecoderBase.extract_features_scriptable"
SYMPTOM = ("a host-device sync per decoder call in training (the padding test of prev_output_tokens), and a "
           "recompile of the decoder layer under --compile at the first batch without target padding")
REMOVE_WHEN = "fairseq builds the decoder's self-attention padding mask without testing it on the host"


def extract_features_scriptable(
    self,
    prev_output_tokens,
    encoder_out: Optional[Dict[str, List[Tensor]]],
    incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
    full_context_alignment: bool = False,
    alignment_layer: Optional[int] = None,
    alignment_heads: Optional[int] = None,
):
    """fairseq's decoder features, the self-attention padding mask built without a host test where there is no
    incremental state (see the module docstring)."""
    if incremental_state is not None:  # incremental decoding: fairseq's own code, its mask test included
        return _fairseq_extract_features_scriptable(self, prev_output_tokens, encoder_out, incremental_state,
                                                    full_context_alignment, alignment_layer, alignment_heads)
    if alignment_layer is None:
        alignment_layer = self.num_layers - 1

    enc: Optional[Tensor] = None
    padding_mask: Optional[Tensor] = None
    if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
        enc = encoder_out["encoder_out"][0]
    if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
        padding_mask = encoder_out["encoder_padding_mask"][0]

    # embed positions
    positions = None
    if self.embed_positions is not None:
        positions = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)

    # Prevent torchscript exporting issue for dynamic quant embedding
    prev_output_tokens = prev_output_tokens.contiguous()
    # embed tokens and positions
    x = self.embed_scale * self.embed_tokens(prev_output_tokens)

    if self.quant_noise is not None:
        x = self.quant_noise(x)

    if self.project_in_dim is not None:
        x = self.project_in_dim(x)

    if positions is not None:
        x += positions

    if self.layernorm_embedding is not None:
        x = self.layernorm_embedding(x)

    x = self.dropout_module(x)

    # B x T x C -> T x B x C
    x = x.transpose(0, 1)

    # the change: the mask is built every time (an all-False mask masks nothing; fairseq built it only
    # if self.cross_self_attention or prev_output_tokens.eq(self.padding_idx).any()), so the device is not asked
    self_attn_padding_mask: Optional[Tensor] = prev_output_tokens.eq(self.padding_idx)

    # decoder layers
    attn: Optional[Tensor] = None
    inner_states: List[Optional[Tensor]] = [x]
    for idx, layer in enumerate(self.layers):
        if not full_context_alignment:
            self_attn_mask = self.buffered_future_mask(x)
        else:
            self_attn_mask = None

        x, layer_attn, _ = layer(
            x,
            enc,
            padding_mask,
            incremental_state,
            self_attn_mask=self_attn_mask,
            self_attn_padding_mask=self_attn_padding_mask,
            need_attn=bool((idx == alignment_layer)),
            need_head_weights=bool((idx == alignment_layer)),
        )
        inner_states.append(x)
        if layer_attn is not None and idx == alignment_layer:
            attn = layer_attn.float().to(x)

    if attn is not None:
        if alignment_heads is not None:
            attn = attn[:alignment_heads]

        # average probabilities over heads
        attn = attn.mean(dim=0)

    if self.layer_norm is not None:
        x = self.layer_norm(x)

    # T x B x C -> B x T x C
    x = x.transpose(0, 1)

    if self.project_out_dim is not None:
        x = self.project_out_dim(x)

    return x, {"attn": [attn], "inner_states": inner_states}


_fairseq_extract_features_scriptable = None  # fairseq's own, for incremental decoding (set by install)


def install():
    from fairseq.models.transformer.transformer_decoder import TransformerDecoderBase

    def make(original):
        global _fairseq_extract_features_scriptable
        _fairseq_extract_features_scriptable = original
        return extract_features_scriptable
    wrap(TransformerDecoderBase, "extract_features_scriptable", make, __name__,
         "(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[torch.Tensor]]], incremental_state: "
         "Optional[Dict[str, Dict[str, Optional[torch.Tensor]]]] = None, full_context_alignment: bool = False, "
         "alignment_layer: Optional[int] = None, alignment_heads: Optional[int] = None)")
