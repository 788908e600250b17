"""Patch: fairseq's transformer encoder passes its padding mask to every layer, without asking the device first.

``TransformerEncoderBase.forward_scriptable`` computes ``has_pads = encoder_padding_mask.any()`` (a tensor on
the device) and calls every layer with ``encoder_padding_mask if has_pads else None``: a host-device sync per
encoder layer (6 per update for the transformer, MSMSA; 12 for Prime's encoder), and on a batch without
padding a ``None`` mask. Under ``--compile`` that ``None`` is another input type, so the first batch without
source padding compiled the encoder layer again (on the H200 at ``af33e1d``, every compiled row's encoder
recompiled at update 12 of the speed table's batches; from the inductor cache, 1-5 s).

``install()`` (on plugin import) replaces it with the same computation that passes the mask every time: a mask
with no padding position masks nothing (the attention adds zeros where the original added nothing; the
embeddings are multiplied by one where the original multiplied by one), so the outputs are the original's, and
nothing is asked of the device. Everything else (embedding, layer norm, the returned dictionary) is fairseq's code
as it is in fairseq-fixed 0.12.3.1.
"""
from typing import Optional

import torch

from umst_plugin.patches import wrap

TARGET = "fairseq.models.transformer.transformer_encoder.TransformerEncoderBase.forward_scriptable"
SYMPTOM = ("a host-device sync per encoder layer and update (has_pads), and a recompile of the encoder layer under "
           "--compile at the first batch without source padding")
REMOVE_WHEN = "fairseq passes the encoder padding mask to its layers without testing it on the host"


def forward_scriptable(
    self,
    src_tokens,
    src_lengths: Optional[torch.Tensor] = None,
    return_all_hiddens: bool = False,
    token_embeddings: Optional[torch.Tensor] = None,
):
    """fairseq's encoder forward, its padding mask passed to every layer (see the module docstring)."""
    # compute padding mask
    encoder_padding_mask = src_tokens.eq(self.padding_idx)

    x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)

    # account for padding while computing the representation (fairseq multiplies by has_pads too: the same values)
    x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x))

    # B x T x C -> T x B x C
    x = x.transpose(0, 1)

    encoder_states = []
    fc_results = []

    if return_all_hiddens:
        encoder_states.append(x)

    # encoder layers
    for layer in self.layers:
        lr = layer(x, encoder_padding_mask=encoder_padding_mask)

        if isinstance(lr, tuple) and len(lr) == 2:
            x, fc_result = lr
        else:
            x = lr
            fc_result = None

        if return_all_hiddens and not torch.jit.is_scripting():
            assert encoder_states is not None
            encoder_states.append(x)
            fc_results.append(fc_result)

    if self.layer_norm is not None:
        x = self.layer_norm(x)

    src_lengths = (
        src_tokens.ne(self.padding_idx)
        .sum(dim=1, dtype=torch.int32)
        .reshape(-1, 1)
        .contiguous()
    )
    return {
        "encoder_out": [x],  # T x B x C
        "encoder_padding_mask": [encoder_padding_mask],  # B x T
        "encoder_embedding": [encoder_embedding],  # B x T x C
        "encoder_states": encoder_states,  # List[T x B x C]
        "fc_results": fc_results,  # List[T x B x C]
        "src_tokens": [],
        "src_lengths": [src_lengths],
    }


def install():
    from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase

    wrap(TransformerEncoderBase, "forward_scriptable", lambda original: forward_scriptable, __name__,
         "(self, src_tokens, src_lengths: Optional[torch.Tensor] = None, return_all_hiddens: bool = False, "
         "token_embeddings: Optional[torch.Tensor] = None)")
