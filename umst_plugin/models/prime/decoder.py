"""Prime's decoder: fairseq's transformer decoder whose layers are Prime layers; it hands the encoder output's beam
mark to its layers."""
from fairseq.models.transformer import TransformerDecoder

from umst_plugin.models.prime.config import prime_layer_kwargs
from umst_plugin.modules.prime.layer import PrimeDecoderLayer, share_mask_memo


class PrimeDecoder(TransformerDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        self._next_layer = 0
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        share_mask_memo(self.layers)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        layer = PrimeDecoderLayer(**prime_layer_kwargs(self.args, self._next_layer, decoder=True))
        self._next_layer += 1
        return layer

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        """TransformerDecoder.forward; first hands the encoder output's beam mark to the layers (per call, so no
        mark outlives the decoding it belongs to)."""
        beams = encoder_out.get("prime_beams", [1])[0] if isinstance(encoder_out, dict) else 1
        for layer in self.layers:
            layer.shared_beams = beams
        return super().forward(prev_output_tokens, encoder_out=encoder_out, incremental_state=incremental_state,
                               **kwargs)
