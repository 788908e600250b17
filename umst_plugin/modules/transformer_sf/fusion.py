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
from umst_plugin.modules.transformer_sf import lean

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
        # the lean reassociated path's constant columns (not parameters, not saved): per head the key input
        # space is widened to ``width`` columns, [kv, 1, 0...] on the key side (see ``_lean``)
        self.width = -(-(kv_dim + 1) // 8) * 8
        if self.reassociate:
            ones_col = torch.zeros(self.width - kv_dim)
            ones_col[0] = 1.0
            self.register_buffer("_ones_col", ones_col, persistent=False)
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.constant_(self.out_proj.bias, 0.0)

    def forward(self, query, kv, key_padding_mask):
        if self.record is None:
            return self._fused(query, kv, key_padding_mask)
        return self._explicit(query, kv, key_padding_mask)

    def forward_lean(self, x_query, query_norm, x_kv, kv_norm, mask):
        """``forward(query_norm(x_query), kv_norm(x_kv), ...)`` with fewer, larger ops and the encoder plan's
        additive key mask (B x 1 x 1 x Lk, -inf at padding). The layer norms feed the products directly
        (``lean.layer_norm_linear``: their outputs are recomputed in backward, not kept).

        Not reassociated: one product for the keys and values. Reassociated (the slow branch reading the
        characters): as ``_fused``, one attention whose keys and values, [kv, 1, 0...], the heads share, with
        the heads' [W^k_h | b^k_h] and [W^v_h | b^v_h] applied by one batched product each. In training, where
        the heads' widened key space is narrower than the query (H * width < Cq: 320 < 512 at base width),
        the query map is multiplied into the key maps and the value maps into the output map first (products
        of the weights, once per step), so the sub-layer is two products of its inputs around the attention:

            q_ext = LN(x) W^q_h^T [W^k_h | b^k_h] + b^q_h [W^k_h | b^k_h]   (per head h)
            out   = sum_h softmax(s q_ext_h [kv | 1]^T) [kv | 1] [W^v_h | b^v_h]^T W^o_h^T + b^o

        (fewer FLOPs per token and nothing Lq x Cq kept but the layer norm's input; in evaluation, where a
        batch can be one sentence, the weight products would cost more than they save). The same function as
        ``_fused`` either way (tests compare them)."""
        len_q, batch, embed_dim = x_query.shape
        len_k = x_kv.size(0)
        heads, head_dim = self.num_heads, self.head_dim
        dropout = self.dropout if self.training else 0.0
        cast = lean.amp_cast  # weights cast whole before use; the custom functions' biases stay float32
        if not self.reassociate:
            q = lean.layer_norm_linear(query_norm, x_query, cast(self.q_proj.weight), self.q_proj.bias)
            q = q.view(len_q, batch, heads, head_dim).permute(1, 2, 0, 3)
            kv = lean.layer_norm_linear(kv_norm, x_kv,
                                        torch.cat([cast(self.k_proj.weight), cast(self.v_proj.weight)]),
                                        torch.cat([self.k_proj.bias, self.v_proj.bias]))
            k, v = kv.view(len_k, batch, 2, heads, head_dim).permute(2, 1, 3, 0, 4).unbind(0)
            out = attention(q, k, v, mask, dropout, scale=self.scaling)
            return self.out_proj(out.permute(2, 0, 1, 3).reshape(len_q, batch, embed_dim))
        c, width = self.kv_dim, self.width
        w_k, w_v = (self._widened(proj) for proj in (self.k_proj, self.v_proj))  # H x d x width
        premultiply = self.training and heads * width < embed_dim
        if premultiply:
            # the query map through every head's [W^k_h | b^k_h | 0]: one Cq -> H*width map (and its bias)
            m = torch.bmm(w_k.transpose(1, 2), cast(self.q_proj.weight).view(heads, head_dim, embed_dim))
            m_bias = torch.bmm(w_k.transpose(1, 2), cast(self.q_proj.bias).view(heads, head_dim, 1))
            q_ext = lean.layer_norm_linear(query_norm, x_query, m.view(heads * width, embed_dim),
                                           m_bias.view(heads * width)).view(len_q, batch, heads, width)
            q_ext = q_ext.permute(1, 2, 0, 3)
        else:
            # every head's query mapped into the key input space, [q_h W^k_h | q_h . b^k_h | 0...]
            q = lean.layer_norm_linear(query_norm, x_query, cast(self.q_proj.weight), self.q_proj.bias)
            q_ext = torch.bmm(q.view(len_q * batch, heads, head_dim).transpose(0, 1), w_k)
            q_ext = q_ext.view(heads, len_q, batch, width).permute(2, 0, 1, 3)
        # the heads share their keys and values: they fold into the queries (B x 1 x H*Lq x width)
        q_ext = q_ext.reshape(batch, 1, heads * len_q, width)
        kv_ext = torch.cat([kv_norm(x_kv).transpose(0, 1), self._ones_col.expand(batch, len_k, width - c)], dim=-1)
        kv_ext = kv_ext.unsqueeze(1).to(q_ext.dtype)
        context = attention(q_ext, kv_ext, kv_ext, mask, dropout, scale=self.scaling).view(batch, heads, len_q,
                                                                                          width)
        if premultiply:
            # [A x̂ | A 1 | 0...] through every head's [W^v_h | b^v_h | 0]^T and W^o_h^T: one H*width -> Cq map
            n = torch.bmm(w_v.transpose(1, 2),
                          cast(self.out_proj.weight).view(embed_dim, heads, head_dim).permute(1, 2, 0))
            context = context.permute(2, 0, 1, 3).reshape(len_q * batch, heads * width)
            return torch.addmm(cast(self.out_proj.bias), context, n.view(heads * width, embed_dim)).view(
                len_q, batch, embed_dim)
        # back to each head's value space, then the output map
        context = context.permute(1, 2, 0, 3).reshape(heads, len_q * batch, width)
        out = torch.bmm(context, w_v.transpose(1, 2)).transpose(0, 1).reshape(len_q, batch, embed_dim)
        return self.out_proj(out)

    def _widened(self, proj):
        """[W_h | b_h | 0...] per head (H x d x width) of the key or value map. (Not cast piecewise under
        autocast: each piece's gradient would be a strided slice, copied once more by the parameter cast cache;
        the products cast the whole widened map.) The zero columns are a pad, not a zero tensor concatenated:
        with one, inductor (torch 2.13, CPU) compiled a backward under bf16 autocast with dropout whose W_h
        gradients were uninitialized memory (NaN, inf, 3e38) at kv_dim 32
        (``tests/test_transformer_sf_lean.py::test_compiled_bf16_cross_attention_gradients_equal_eager``)."""
        heads, head_dim = self.num_heads, self.head_dim
        widened = torch.cat([proj.weight.view(heads, head_dim, self.kv_dim), proj.bias.view(heads, head_dim, 1)],
                            dim=-1)
        return F.pad(widened, (0, self.width - self.kv_dim - 1))

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

    def forward(self, x_self, x_other, other_padding_mask, char_token_index, mask=None):
        """``mask``: the encoder plan's additive mask of the other branch's padding (B x 1 x 1 x L_other): the
        lean path (``lean.py``)."""
        if self.kind == "cga" and mask is not None and self.attn.record is None:
            return self.attn.forward_lean(x_self, self.self_layer_norm, x_other, self.other_layer_norm, mask)
        other = self.other_layer_norm(x_other)
        if self.kind == "cga":
            return self.attn(self.self_layer_norm(x_self), other, other_padding_mask)
        if self.kind == "linear-attention":
            other = self.other_proj(other)
            if mask is not None and lean.unhooked(self.attn):
                return lean.multihead_cross_attention(self.attn, self.self_layer_norm(x_self), other, mask,
                                                      self.training)
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
