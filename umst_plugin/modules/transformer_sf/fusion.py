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

Efficiency of CGA: when the receiver is the slow branch, the keys/values are the
~5x longer, 16x thinner character states. Projecting them up to H_s
(L_f x H_f x H_s per map) is the bulk of TranSFormer's extra cost (paper 4.3,
"upsampling ... within the cross-granularity attention"). ``WidthChangingAttention``
computes the *same* function in the cheaper order when ``heads * H_kv <= H_q``:
per head, q_h (x̂ W^k_h)^T = (q_h W^k_h) x̂^T and A (x̂ W^v_h + b^v_h) =
(A x̂) W^v_h + (A 1) b^v_h; the key bias adds a per-query constant (kept, though
softmax ignores it). Nothing of length L_f x H_s is formed. The order is fixed per module
(not per batch), so results never depend on batch composition.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq.modules import MultiheadAttention

from umst_plugin.modules.common.attention import attention
from umst_plugin.modules.common.segment_ops import segment_mean, upcast_half

FUSIONS = ("cga", "linear-attention", "ds-concat", "ds-sum")


def chars_to_tokens(x_fast, char_token_index, num_tokens):
    """Mean of each subword's characters: Lf x B x C -> T x B x C (zero for tokens without characters).

    char_token_index: B x Lf, 1-based token column, 0 at padding."""
    length, batch, channels = x_fast.shape
    slots = num_tokens + 1
    slot = (char_token_index + torch.arange(batch, device=x_fast.device).view(-1, 1) * slots).reshape(-1)
    values = x_fast.transpose(0, 1).reshape(-1, channels)
    means = segment_mean(values, slot, batch * slots).view(batch, slots, channels)[:, 1:]
    return means.transpose(0, 1).to(x_fast.dtype)


def tokens_to_chars(x_slow, char_token_index):
    """Each character copies its subword's state: T x B x C -> Lf x B x C (zero at padding)."""
    index = (char_token_index - 1).clamp(min=0)  # B x Lf
    gathered = torch.gather(x_slow.transpose(0, 1), 1, index.unsqueeze(-1).expand(-1, -1, x_slow.size(2)))
    gathered = gathered.masked_fill(char_token_index.eq(0).unsqueeze(-1), 0.0)
    return gathered.transpose(0, 1)


class WidthChangingAttention(nn.Module):
    """Multi-head cross-attention whose keys/values have another width (Eq. 2).

    forward(query [Lq x B x Cq], kv [Lk x B x Ckv], key_padding_mask [B x Lk] bool) -> Lq x B x Cq.
    Parameters: q_proj Cq->Cq, k_proj / v_proj Ckv->Cq (W^k, W^v in R^{Ckv x Cq}), out_proj Cq->Cq.

    ``record``: None (default, nothing kept) or a list to which every forward appends its attention
    weights (B x H x Lq x Lk, detached); set per instance by ``umst-inspect``.
    """

    record = None

    def __init__(self, embed_dim, kv_dim, num_heads, dropout=0.0):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"cross-attention width {embed_dim} is not divisible by its {num_heads} heads")
        self.embed_dim, self.kv_dim, self.num_heads = embed_dim, kv_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(kv_dim, embed_dim)
        self.v_proj = nn.Linear(kv_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        # Contract through the thin side when it is cheaper (see module docstring).
        self.reassociate = num_heads * kv_dim <= embed_dim
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.constant_(self.out_proj.bias, 0.0)

    def forward(self, query, kv, key_padding_mask):
        if self.record is None:
            return self._fused(query, kv, key_padding_mask)
        return self._explicit(query, kv, key_padding_mask)

    def _fused(self, query, kv, key_padding_mask):
        """The same function through ``modules.attention.attention`` (no weights kept for backward)."""
        len_q, batch, _ = query.shape
        heads, head_dim = self.num_heads, self.head_dim
        q = (self.q_proj(query) * self.scaling).view(len_q, batch, heads, head_dim).permute(1, 2, 0, 3)
        keep = (~key_padding_mask).view(batch, 1, 1, -1)
        dropout = self.dropout if self.training else 0.0
        if not self.reassociate:
            k = self.k_proj(kv).view(-1, batch, heads, head_dim).permute(1, 2, 0, 3)
            v = self.v_proj(kv).view(-1, batch, heads, head_dim).permute(1, 2, 0, 3)
            out = attention(q, k, v, keep, dropout, scale=1.0)
        else:
            # Keys and values are the thin kv itself, shared by the heads, with one column of ones: the query
            # gets q . b^k in that column (the logits' per-query constant: their exact value, and k_proj.bias's
            # zero gradient) and the value side b^v (each query's attention mass times the value bias, also
            # under dropout). Columns are padded to a multiple of 8 with zeros (the fused kernels' alignment).
            w_k = self.k_proj.weight.view(heads, head_dim, self.kv_dim)
            q_k = torch.einsum("bhqd,hdc->bhqc", q, w_k)  # the query mapped into the key input space
            q_bias = (q * self.k_proj.bias.view(1, heads, 1, head_dim)).sum(-1, keepdim=True)
            kv_b = kv.transpose(0, 1).unsqueeze(1)  # B x 1 x Lk x Ckv
            width = -(-(self.kv_dim + 1) // 8) * 8
            pad = width - self.kv_dim - 1
            q_ext = F.pad(torch.cat([q_k, q_bias.to(q_k.dtype)], dim=-1), (0, pad))
            kv_ext = F.pad(torch.cat([kv_b, torch.ones_like(kv_b[..., :1])], dim=-1), (0, pad))
            kv_ext = kv_ext.to(q_ext.dtype)  # B x 1 x Lk x width: one key/value set for every head
            # The heads share their keys and values, so they fold into the queries (B x 1 x H*Lq x width): a
            # dense problem for the fused kernels, with no keys or values copied per head.
            context = attention(q_ext.reshape(batch, 1, heads * len_q, width), kv_ext, kv_ext, keep, dropout,
                                scale=1.0).view(batch, heads, len_q, width)
            w_v = self.v_proj.weight.view(heads, head_dim, self.kv_dim)
            out = torch.einsum("bhqc,hdc->bhqd", context[..., :self.kv_dim], w_v)
            out = out + context[..., self.kv_dim:self.kv_dim + 1] * self.v_proj.bias.view(1, heads, 1, head_dim)
        out = out.permute(2, 0, 1, 3).reshape(len_q, batch, self.embed_dim)
        return self.out_proj(out)

    def _explicit(self, query, kv, key_padding_mask):
        """The reference path, with the attention weights recorded (``record``, for umst-inspect)."""
        len_q, batch, _ = query.shape
        heads, head_dim = self.num_heads, self.head_dim
        q = (self.q_proj(query) * self.scaling).view(len_q, batch, heads, head_dim).permute(1, 2, 0, 3)
        kv_b = kv.transpose(0, 1)  # B x Lk x Ckv
        if self.reassociate:
            w_k = self.k_proj.weight.view(heads, head_dim, self.kv_dim)
            q_k = torch.einsum("bhqd,hdc->bhqc", q, w_k)  # query mapped into the key input space
            logits = torch.einsum("bhqc,bkc->bhqk", q_k, kv_b)
            # q_h . b^k_h is the same for every key, so softmax ignores it; adding it keeps the exact
            # function and gives k_proj.bias its (zero) gradient, as DDP needs every parameter used.
            logits += (q * self.k_proj.bias.view(1, heads, 1, head_dim)).sum(-1, keepdim=True)  # fresh tensor
        else:
            k = self.k_proj(kv).view(-1, batch, heads, head_dim).permute(1, 2, 3, 0)  # B x H x d x Lk
            logits = torch.matmul(q, k)
        logits = upcast_half(logits)
        logits.masked_fill_(key_padding_mask.view(batch, 1, 1, -1), float("-inf"))  # fresh tensor: in place
        weights = F.dropout(F.softmax(logits, dim=-1), p=self.dropout, training=self.training).to(q.dtype)
        self.record.append(weights.detach())
        if self.reassociate:
            context = torch.einsum("bhqk,bkc->bhqc", weights, kv_b)
            w_v = self.v_proj.weight.view(heads, head_dim, self.kv_dim)
            out = torch.einsum("bhqc,hdc->bhqd", context, w_v)
            # the value bias is weighted by the (dropped-out) attention mass of each query
            out = out + weights.sum(-1, keepdim=True) * self.v_proj.bias.view(1, heads, 1, head_dim)
        else:
            v = self.v_proj(kv).view(-1, batch, heads, head_dim).permute(1, 2, 0, 3)
            out = torch.matmul(weights, v)
        out = out.permute(2, 0, 1, 3).reshape(len_q, batch, self.embed_dim)
        return self.out_proj(out)


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
            self.attn = WidthChangingAttention(self_dim, other_dim, num_heads, attention_dropout)
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
        if self.kind == "cga":
            return self.attn(self.self_layer_norm(x_self), other, other_padding_mask)
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
