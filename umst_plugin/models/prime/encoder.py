"""Prime's encoder: fairseq's transformer encoder whose layers are Prime layers
(:mod:`umst_plugin.modules.prime.layer`), with the beam mark that lets the decoder keep one copy of the
cross-attention keys per sentence."""
from fairseq.models.transformer import TransformerEncoder

from umst_plugin.models.prime.config import prime_layer_kwargs
from umst_plugin.modules.prime.layer import PrimeEncoderLayer, share_mask_memo


class PrimeEncoder(TransformerEncoder):
    def __init__(self, args, dictionary, embed_tokens):
        self._next_layer = 0  # build_encoder_layer is called once per layer, bottom first
        super().__init__(args, dictionary, embed_tokens)
        share_mask_memo(self.layers)  # the attention masks are built once per forward pass, not once per layer

    def build_encoder_layer(self, cfg):
        layer = PrimeEncoderLayer(**prime_layer_kwargs(self.args, self._next_layer, decoder=False))
        self._next_layer += 1
        return layer

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False, token_embeddings=None):
        """As TransformerEncoder.forward; extra inputs of side-data tasks (src_word_ids, ...) are ignored."""
        return self.forward_scriptable(src_tokens, src_lengths, return_all_hiddens, token_embeddings)

    beam_size = 1  # set by PrimeModel.set_beam_size (fairseq's SequenceGenerator)

    def reorder_encoder_out(self, encoder_out, new_order):
        """TransformerEncoder's reorder, plus the beam mark ``prime_beams``: fairseq's SequenceGenerator first
        reorders the encoder output with each sentence repeated ``beam_size`` times in a row (new_order =
        arange(bsz).repeat_interleave(beam)); later reorders keep whole sentences. Whether a reorder is that
        expansion is read from the sizes alone (bsz rows in, bsz x beam_size out), so no host-device sync;
        the mark tells the decoder's Prime layers that they may keep one copy of the cross-attention keys per
        sentence."""
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        beams = encoder_out.get("prime_beams", [1])[0] if isinstance(encoder_out, dict) else 1
        if beams == 1 and self.beam_size > 1 and encoder_out["encoder_out"]:
            if new_order.numel() == self.beam_size * encoder_out["encoder_out"][0].size(1):
                beams = self.beam_size
        if beams > 1 and new_order.numel() % beams == 0:
            reordered["prime_beams"] = [beams]
        return reordered
