"""Cross-granularity fusion between the slow (subword) and fast (character) branches.

TranSFormer 3.3 / Eq. 2 (CGA, the default): the receiving branch's queries attend
the other branch's states after *their own* layer norm, with key/value maps that
change width (W^k, W^v in R^{H_other x H_self}):

    x̂ = LN_other(x_other);  CGA = softmax(q (x̂ W^k)^T / sqrt(d_k)) x̂ W^v.

The query side is pre-normed too (the paper follows pre-norm throughout, fig. 3
caption). Ablations of table 4b:

* ``linear-attention`` ("Linear + Attention"): project x̂ to the receiver's width
  with a linear map, then a standard same-width cross-attention (more parameters).
* ``ds-concat`` / ``ds-sum``: resample the other branch to the receiver's length
  (characters -> subwords: mean of each subword's characters; subwords ->
  characters: each character copies its subword's state) and fuse by
  ``W [LN(x_self); r]`` or ``W r``.

Every module returns the update that the caller adds to the residual stream
(after dropout). Tensors are time-first (L x B x C).
"""
import torch
import torch.nn as nn

from fairseq.modules import MultiheadAttention

FUSIONS = ("cga", "linear-attention", "ds-concat", "ds-sum")


def chars_to_tokens(x_fast, char_token_index, num_tokens):
    """Mean of each subword's characters: Lf x B x C -> T x B x C (zero for tokens without characters).

    char_token_index: B x Lf, 1-based token column, 0 at padding."""
    length, batch, channels = x_fast.shape
    slots = num_tokens + 1
    slot = (char_token_index + torch.arange(batch, device=x_fast.device).view(-1, 1) * slots).reshape(-1)
    values = x_fast.transpose(0, 1).reshape(-1, channels)
    acc_dtype = torch.float32 if values.dtype in (torch.float16, torch.bfloat16) else values.dtype
    sums = values.new_zeros(batch * slots, channels, dtype=acc_dtype).index_add_(0, slot, values.to(acc_dtype))
    counts = torch.zeros(batch * slots, dtype=acc_dtype, device=values.device)
    counts.index_add_(0, slot, torch.ones_like(slot, dtype=acc_dtype))
    means = (sums / counts.clamp(min=1).unsqueeze(1)).view(batch, slots, channels)[:, 1:]
    return means.transpose(0, 1).to(x_fast.dtype)


def tokens_to_chars(x_slow, char_token_index):
    """Each character copies its subword's state: T x B x C -> Lf x B x C (zero at padding)."""
    batch = x_slow.size(1)
    index = (char_token_index - 1).clamp(min=0)  # B x Lf
    gathered = torch.gather(x_slow.transpose(0, 1), 1, index.unsqueeze(-1).expand(-1, -1, x_slow.size(2)))
    gathered = gathered.masked_fill(char_token_index.eq(0).unsqueeze(-1), 0.0)
    return gathered.transpose(0, 1)


class CrossGranularityFusion(nn.Module):
    """One direction of fusion: ``receiver`` ('slow' or 'fast') reads the other branch.

    forward(x_self, x_other, other_padding_mask, char_token_index) -> update (like x_self).
    """

    def __init__(self, kind, self_dim, other_dim, num_heads, receiver, attention_dropout=0.0):
        super().__init__()
        if kind not in FUSIONS:
            raise ValueError(f"unknown fusion {kind!r}; expected one of {FUSIONS}")
        if receiver not in ("slow", "fast"):
            raise ValueError(f"receiver must be 'slow' or 'fast', got {receiver!r}")
        self.kind, self.receiver = kind, receiver
        self.other_layer_norm = nn.LayerNorm(other_dim)
        self.self_layer_norm = nn.LayerNorm(self_dim) if kind != "ds-sum" else None
        if kind == "cga":
            self.attn = MultiheadAttention(self_dim, num_heads, kdim=other_dim, vdim=other_dim,
                                           dropout=attention_dropout, encoder_decoder_attention=True)
        elif kind == "linear-attention":
            self.other_proj = nn.Linear(other_dim, self_dim)
            self.attn = MultiheadAttention(self_dim, num_heads, dropout=attention_dropout,
                                           encoder_decoder_attention=True)
        elif kind == "ds-concat":
            self.proj = nn.Linear(self_dim + other_dim, self_dim)
        else:
            self.proj = nn.Linear(other_dim, self_dim)

    def forward(self, x_self, x_other, other_padding_mask, char_token_index):
        other = self.other_layer_norm(x_other)
        if self.kind in ("cga", "linear-attention"):
            if self.kind == "linear-attention":
                other = self.other_proj(other)
            out, _ = self.attn(query=self.self_layer_norm(x_self), key=other, value=other,
                               key_padding_mask=other_padding_mask, need_weights=False)
            return out
        if self.receiver == "slow":
            resampled = chars_to_tokens(other, char_token_index, x_self.size(0))
        else:
            resampled = tokens_to_chars(other, char_token_index)
        if self.kind == "ds-concat":
            return self.proj(torch.cat([self.self_layer_norm(x_self), resampled], dim=-1))
        return self.proj(resampled)
