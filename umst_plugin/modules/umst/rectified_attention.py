"""Rectified self-attention (RSAN, UMST section 3.4), optionally with Shaw et al. relative positions.

Two maps, each from its own query/key projections:

* ATTN1 = softmax(Q1 K1^T / sqrt(d_k)) over the subword stream (L x L, padding keys masked);
* ATTN2 = softmax(Q2 K2^T / sqrt(d_k)) over the word stream (L' x L', padding *words* masked,
  which the authors' code forgot);

fused by averaging, ``ATTN = (ATTN1 + ATTN2') / 2``, and applied to values V from the subword
stream only, per head. ATTN2' is ATTN2 up-sampled to subwords (Eq. 4).

We never build ATTN2' (L x L) nor G: since ``ATTN2' V = G ATTN2 (G^T V)``, we down-sample V to
words (an index_add over per-token word indices), attend at word level, and up-sample the result
with a gather on the word indices. The extra work over a transformer is O(B.H.L'^2) for ATTN2
(L' <= L words) plus O(B.L.d) for the scatter/gather. With no relative positions both maps run
through ``modules.attention.attention`` (``F.scaled_dot_product_attention``, as fairseq's MultiheadAttention
does for the transformer baseline: no map kept for backward, flash / memory-efficient kernels on GPUs).

Attention dropout (``attention_dropout_mode``): a deliberate change
-------------------------------------------------------------------
The paper does not say where attention dropout goes; a transformer drops entries of its one map,
which here would be the fused map ``(ATTN1 + ATTN2')/2`` and would force building ATTN2' (L x L).
``per-map`` (default) drops entries of ATTN1 (inside SDPA) and of ATTN2 at word level (so the entries
of ATTN2' that come from one word pair share one draw): each branch is still an unbiased estimate
of its map, so the expected output is the same as with ``fused``, only the noise differs; in
evaluation the two are identical. ``fused`` keeps the exact transformer-style form: in training it
builds ATTN1 and ATTN2' (gathers, ``graphs.upsample_attention_map``), averages them and drops
entries of the average (O(B.H.L^2) more memory and time); with relative positions, Shaw et al.'s
value term sees ATTN1's share of the same dropped entries. Tests check that the two paths agree
exactly without dropout and that ``fused`` drops entries of the dense reference map.

Up-sampling normalisation (``upsample_norm``)
---------------------------------------------
``literal``: ATTN2' = G ATTN2 G^T exactly as Eq. 4. Row i of it sums to sum_w ATTN2[w_i, w] n_w,
where n_w is the number of pieces of word w, i.e. to the average piece count (> 1 whenever a
word has several pieces). The fused map is then not a distribution and the word branch is
weighted up by the segmentation granularity, contradicting section 3.4's "we choose the
average pooling to guarantee the normalization".

``row`` (default): ATTN2' = G ATTN2 diag(1/n) G^T, i.e. each word's attention mass is split
evenly among its pieces. Every row sums to 1, so (ATTN1 + ATTN2')/2 is a distribution as the paper
intends, and the word-level distribution ATTN2 is preserved exactly (the total mass that token i
puts on word w is ATTN2[w_i, w]); dividing each row by its sum instead would also normalise but
would shift mass towards words with more pieces. It equals attending over the *mean* of each
word's values, the same average pooling section 3.3 uses to down-sample. We pick it as default
because it is the only reading under which the paper's normalisation claim holds and it makes
the fusion independent of BPE granularity; ``literal`` reproduces Eq. 4 (and the authors' code)
verbatim. For the nearest/linear interpolation ablations R replaces G and ``row`` divides by R's
column sums, which again makes every row sum to 1.

Relative positions (``max_relative_positions = k > 0``, the paper's "UMST + RPR")
-------------------------------------------------------------------------------
Shaw et al. (2018): ATTN1 logits get q_i . a^K_{clip(j-i, k)} and the ATTN1-weighted values get
a^V_{clip(j-i, k)}, per head dimension, shared across heads, with clipping distance k. They are
applied to the subword branch (the one that sees token positions); the word branch has no
position input of its own, as in the paper's figure 2.

The relative terms are computed banded, never as L x L x d_k tensors: with b(i, j) = clip(j - i, k) + k,
the key term is ``gather(q a^K^T, b)`` (q a^K^T is B x H x L x (2k+1)) and the value term is
``(sum of ATTN1[i, j] over j with b(i, j) = b) a^V``, a scatter-add of ATTN1 into B x H x L x (2k+1) bins.
Both need ATTN1 itself, so this subword branch keeps an explicit map (the word branch stays fused); in
training that map's core is recomputed in backward (``torch.utils.checkpoint``, the same dropout mask)
instead of being kept.
Every explicit path scales q before q . k (fp16 range), as fairseq's attention does.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from umst_plugin.modules.common.amp_functions import amp_backward, amp_forward, autocast_cast
from umst_plugin.modules.common.attention import attention
from umst_plugin.modules.common.segment_ops import upcast_half
from umst_plugin.modules.common.tracing import compiling
from umst_plugin.modules.umst.graphs import UMSTGraphs, project_to_words, upsample_attention_map, upsample_tokens
from umst_plugin.modules.umst.lean_gcn import _operator

UPSAMPLE_NORMS = ("row", "literal")


def relative_buckets(length, max_distance, device):
    """L x L long: b(i, j) = clip(j - i, -k, k) + k, the relative-position bucket of key j for query i."""
    pos = torch.arange(length, device=device)
    return (pos.unsqueeze(0) - pos.unsqueeze(1)).clamp(-max_distance, max_distance) + max_distance


def relative_key_logits(q_scaled, rel_keys, buckets):
    """Shaw et al.'s key term q_i . a^K_{b(i,j)} (B x H x L x L) from q a^K^T (B x H x L x (2k+1))."""
    banded = torch.matmul(q_scaled, rel_keys.t())
    return torch.gather(banded, -1, buckets.expand(*banded.shape[:2], *buckets.shape))


def relative_value_term(probs, rel_values, buckets):
    """Shaw et al.'s value term sum_j probs_ij a^V_{b(i,j)} (B x H x L x d): probs summed per bucket, then
    times the (2k+1) x d table."""
    bins = probs.new_zeros(*probs.shape[:-1], rel_values.size(0))
    bins = bins.scatter_add(-1, buckets.expand(*probs.shape[:2], *buckets.shape), probs)
    return torch.matmul(bins.to(rel_values.dtype), rel_values)
ATTENTION_DROPOUT_MODES = ("per-map", "fused")


class _HalfSum(torch.autograd.Function):
    """``½(a + up @ w)`` (B x T x C) in one ``baddbmm``; backward: ``½ g`` for ``a`` and ``up^T (½ g)`` for ``w``
    (``up`` takes no gradient). Scaling by ½ is exact, so this is ``0.5 * (a + up @ w)`` to the bit."""

    @staticmethod
    @amp_forward
    def forward(ctx, a, up, w):
        ctx.save_for_backward(up)
        return torch.baddbmm(a, up, w, beta=0.5, alpha=0.5)

    @staticmethod
    @amp_backward
    def backward(ctx, grad):
        (up,) = ctx.saved_tensors
        half = grad * 0.5
        return half, None, torch.bmm(up.transpose(1, 2), half) if ctx.needs_input_grad[2] else None


class PackedLinear(nn.Module):
    """``count`` linear maps ``embed_dim -> embed_dim`` stored as one ``count*C x C`` weight and one ``count*C`` bias
    (rows ``i*C:(i+1)*C`` are map ``i``), as ``nn.MultiheadAttention`` stores its ``in_proj_weight``.

    Why one parameter: the maps run as one product, and under ``--amp`` that product reads one parameter cast
    whole, which autocast's parameter cache (``umst_plugin.amp_weights``) casts with all the others once per update.
    Stored apart, the forward pass concatenated their casts (two kernels per packed product and layer). Each map is
    initialised as ``nn.Linear`` initialises its own weight and bias, in the same order, so a seed gives the values
    the separate maps had."""

    def __init__(self, embed_dim, count):
        super().__init__()
        self.embed_dim, self.count = embed_dim, count
        self.weight = nn.Parameter(torch.empty(count * embed_dim, embed_dim))
        self.bias = nn.Parameter(torch.empty(count * embed_dim))
        bound = 1 / math.sqrt(embed_dim)
        for i in range(count):  # nn.Linear.reset_parameters, map by map
            weight, bias = self.piece(i)
            with torch.no_grad():
                nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
                nn.init.uniform_(bias, -bound, bound)

    def piece(self, index):
        """(weight, bias) of map ``index``: views of the packed parameters."""
        rows = slice(index * self.embed_dim, (index + 1) * self.embed_dim)
        return self.weight[rows], self.bias[rows]

    def project(self, x, index):
        """Map ``index`` of ``x`` alone: the reference path's form."""
        return F.linear(x, *self.piece(index))

    def forward(self, x):
        """All maps of ``x`` in one product, outputs concatenated on the last dimension."""
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"{self.count} x ({self.embed_dim} -> {self.embed_dim})"

    def pack_separate_maps(self, state_dict, name, old_names):
        """A checkpoint from before the maps were packed stores ``<parent>.<old_name>.weight`` / ``.bias`` per map:
        concatenated into ``<name>.weight`` / ``.bias`` (the same values)."""
        parent = name.rsplit(".", 1)[0] + "." if "." in name else ""
        if parent + old_names[0] + ".weight" not in state_dict:
            return
        for kind in ("weight", "bias"):
            state_dict[f"{name}.{kind}"] = torch.cat([state_dict.pop(f"{parent}{old}.{kind}") for old in old_names])


class RectifiedSelfAttention(nn.Module):
    """Multi-head RSAN. Batch-first: ``forward(x B x T x C, x_word B x W x C, graphs) -> B x T x C``.

    With the graphs' dense operators (``graphs.dense_operators``) the default path projects Q, K, V in one
    product, the word Q, K in another, pools the values to words with one bmm and up-samples and adds the word
    branch with one ``baddbmm``; ``reference = True`` (or graphs without dense operators) runs the plain form
    (separate projections, index-based pooling and gather), which it equals (tested in float64)."""

    reference = False  # set True (modules.common.lean_ops.use_reference_path) for the plain reference form
    reference_switch = True

    def __init__(
        self,
        embed_dim,
        num_heads,
        attention_dropout=0.0,
        upsample_norm="row",
        share_qk=False,
        max_relative_positions=0,
        recompute_word_branch=False,
        attention_dropout_mode="per-map",
    ):
        super().__init__()
        self.recompute_word_branch = recompute_word_branch
        if attention_dropout_mode not in ATTENTION_DROPOUT_MODES:
            raise ValueError(f"unknown attention_dropout_mode {attention_dropout_mode!r}; "
                             f"choose from {ATTENTION_DROPOUT_MODES}")
        self.attention_dropout_mode = attention_dropout_mode
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        if upsample_norm not in UPSAMPLE_NORMS:
            raise ValueError(f"unknown upsample_norm {upsample_norm!r}; choose from {UPSAMPLE_NORMS}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.attention_dropout = attention_dropout
        self.upsample_norm = upsample_norm
        self.share_qk = share_qk
        self.max_relative_positions = max_relative_positions

        self.in_proj = PackedLinear(embed_dim, 3)  # W_q, W_k, W_v of the subword stream
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        # the word stream's W_q, W_k; with share_qk (table 6 row 4) the word branch reuses the subword W_q, W_k
        self.word_in_proj = None if share_qk else PackedLinear(embed_dim, 2)
        if max_relative_positions > 0:
            self.rel_keys = nn.Embedding(2 * max_relative_positions + 1, self.head_dim)
            self.rel_values = nn.Embedding(2 * max_relative_positions + 1, self.head_dim)
        else:
            self.rel_keys = self.rel_values = None
        self.reset_parameters()

    def reset_parameters(self):
        # As fairseq's MultiheadAttention: scaled xavier for q/k/v, plain xavier for the output.
        gain = 1 / math.sqrt(2)
        for packed in (self.in_proj, self.word_in_proj):
            for i in range(packed.count if packed is not None else 0):
                weight, bias = packed.piece(i)
                with torch.no_grad():  # map by map: each weight's fans are C x C
                    nn.init.xavier_uniform_(weight, gain=gain)
                    nn.init.zeros_(bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)
        if self.rel_keys is not None:
            nn.init.xavier_uniform_(self.rel_keys.weight)
            nn.init.xavier_uniform_(self.rel_values.weight)

    def _word_maps(self):
        """The PackedLinear whose first two maps are the word stream's W_q, W_k."""
        return self.in_proj if self.share_qk else self.word_in_proj

    def upgrade_state_dict_named(self, state_dict, name):
        """Checkpoints from before the projections were packed (``q_proj``, ``k_proj``, ``v_proj``, ``word_q_proj``,
        ``word_k_proj``) load with their maps concatenated (the same model)."""
        prefix = f"{name}." if name else ""
        self.in_proj.pack_separate_maps(state_dict, prefix + "in_proj", ("q_proj", "k_proj", "v_proj"))
        if self.word_in_proj is not None:
            self.word_in_proj.pack_separate_maps(state_dict, prefix + "word_in_proj", ("word_q_proj", "word_k_proj"))

    def _packed_weights(self, device_type):
        """(weight, bias) of the q/k/v maps and (weight, bias) of the word q/k maps, for the packed products. Each
        parameter is cast whole (under autocast), as autocast would cast it inside its product, so that autocast's
        parameter cache takes it; with share_qk the word maps are the first rows of that one cast."""
        weight = autocast_cast(self.in_proj.weight, device_type)
        bias = autocast_cast(self.in_proj.bias, device_type)
        if self.share_qk:
            return weight, bias, weight[: 2 * self.embed_dim], bias[: 2 * self.embed_dim]
        return (weight, bias, autocast_cast(self.word_in_proj.weight, device_type),
                autocast_cast(self.word_in_proj.bias, device_type))

    def _heads(self, t):  # B x N x C -> B x H x N x d_k
        return t.view(t.size(0), t.size(1), self.num_heads, self.head_dim).transpose(1, 2)

    def _merge(self, t):  # B x H x N x d_k -> B x N x C
        return t.transpose(1, 2).reshape(t.size(0), t.size(2), self.embed_dim)

    def _buckets(self, graphs: UMSTGraphs, length, device):
        """The relative-position buckets for ``length`` tokens: the batch's (``graphs.relative_buckets``, made once
        by the encoder for every layer, with the model's clipping distance) where it has them, else made here."""
        buckets = graphs.relative_buckets
        if buckets is not None and buckets.size(0) == length:
            return buckets
        return relative_buckets(length, self.max_relative_positions, device)

    def _subword_attention(self, q, k, v, key_pad, mask=None, buckets=None):
        """``mask``: the key mask as given to ``attention`` (default: True at the real keys of ``key_pad``);
        ``buckets``: the relative-position buckets, with relative positions (made here when not given)."""
        dropout = self.attention_dropout if self.training else 0.0
        if self.rel_keys is None:
            if mask is None:
                mask = (~key_pad).view(key_pad.size(0), 1, 1, key_pad.size(1))
            return attention(q, k, v, mask, dropout)
        # Shaw et al., banded (module docstring): the map is explicit; in training its core is recomputed in
        # backward (same dropout mask) rather than keeping the B x H x L x L logits and probabilities. Compiled, it
        # is not: the compiler keeps the products' half-precision logits and the softmax's row statistics (B x H x
        # L x L, 2 bytes an entry) and its backward reads them, where the recomputation ran the core's products,
        # copies and softmax again (on a simulated H200, 5 kernels fewer per encoder layer and 0.3 GB less traffic
        # per update of 4,096 tokens of WMT14's lengths; docs/compile.md).
        if self.training and torch.is_grad_enabled() and not compiling():
            return checkpoint(self._relative_core, q, k, v, key_pad, dropout, buckets, use_reentrant=False)
        return self._relative_core(q, k, v, key_pad, dropout, buckets)

    def _relative_core(self, q, k, v, key_pad, dropout, buckets=None):
        if buckets is None:
            buckets = relative_buckets(q.size(2), self.max_relative_positions, q.device)
        q = q * (1.0 / math.sqrt(self.head_dim))
        if compiling():
            # q, k and v are head views of one packed projection; the batched products need each in the B*H x L x d
            # layout, which inductor copied them into in three kernels (forward, and again where backward recomputes
            # this core): stacked, one copy. The same values (a copy).
            q, k, v = torch.stack([q, k, v]).unbind(0)
        scores = torch.matmul(q, k.transpose(-1, -2)) + relative_key_logits(q, self.rel_keys.weight, buckets)
        scores = upcast_half(scores).masked_fill(key_pad.view(key_pad.size(0), 1, 1, -1), float("-inf"))
        attn = F.dropout(torch.softmax(scores, dim=-1), p=dropout, training=dropout > 0)
        return torch.matmul(attn.to(v.dtype), v) + relative_value_term(attn, self.rel_values.weight, buckets).to(v.dtype)

    def forward(self, x, x_word, graphs: UMSTGraphs):
        """x: B x T x C (normalised subword stream), x_word: B x W x C (normalised word stream)."""
        if self.attention_dropout_mode == "fused" and self.training:
            return self._fused_map_forward(x, x_word, graphs)
        if self.reference or graphs.up is None or graphs.proj_norm != self.upsample_norm:
            return self._reference_forward(x, x_word, graphs)
        # One product for Q, K and V (one packed parameter; the gradient of the split is one concat).
        weight, bias, word_weight, word_bias = self._packed_weights(x.device.type)
        q, k, v_tokens = F.linear(x, weight, bias).split(self.embed_dim, dim=-1)
        buckets = self._buckets(graphs, x.size(1), x.device) if self.rel_keys is not None else None
        out_subword = self._subword_attention(self._heads(q), self._heads(k), self._heads(v_tokens),
                                              graphs.token_pad, _operator(graphs.token_attn_mask, q), buckets)
        if self.recompute_word_branch and self.training and torch.is_grad_enabled():
            out_word = checkpoint(self._word_branch_dense, x_word, v_tokens, word_weight, word_bias, graphs,
                                  use_reentrant=False)
        else:
            out_word = self._word_branch_dense(x_word, v_tokens, word_weight, word_bias, graphs)
        # ½(ATTN1 V + R (ATTN2 (R~^T V))): the up-sampling, the sum and the ½ in one product.
        return self.out_proj(_HalfSum.apply(self._merge(out_subword), _operator(graphs.up, out_word), out_word))

    def _word_branch_dense(self, x_word, v_tokens, word_weight, word_bias, graphs: UMSTGraphs):
        """ATTN2 (R~^T V) at word level, B x W x C (merged heads); R~^T = ``graphs.proj`` (a bmm)."""
        q_word, k_word = F.linear(x_word, word_weight, word_bias).split(self.embed_dim, dim=-1)
        v_word = torch.bmm(_operator(graphs.proj, v_tokens), v_tokens)
        dropout = self.attention_dropout if self.training else 0.0
        out = attention(self._heads(q_word), self._heads(k_word), self._heads(v_word),
                        _operator(graphs.word_attn_mask, q_word), dropout)
        return self._merge(out)

    def _reference_forward(self, x, x_word, graphs: UMSTGraphs):
        """The plain form (separate projections, index-based down- and up-sampling): the reference the
        dense path is tested against, and the path for graphs built without dense operators."""
        q = self._heads(self.in_proj.project(x, 0))
        k = self._heads(self.in_proj.project(x, 1))
        v_tokens = self.in_proj.project(x, 2)
        buckets = self._buckets(graphs, x.size(1), x.device) if self.rel_keys is not None else None
        out_subword = self._merge(self._subword_attention(q, k, self._heads(v_tokens), graphs.token_pad,
                                                          buckets=buckets))
        if self.recompute_word_branch and self.training and torch.is_grad_enabled():
            out_word = checkpoint(self._word_branch, x_word, v_tokens, graphs, use_reentrant=False)
        else:
            out_word = self._word_branch(x_word, v_tokens, graphs)
        return self.out_proj(0.5 * (out_subword + out_word))

    def _word_branch(self, x_word, v_tokens, graphs: UMSTGraphs):
        """ATTN2' V = G ATTN2 (G^T V) (or its row-normalised form), B x T x C."""
        q_word = self._heads(self._word_maps().project(x_word, 0))
        k_word = self._heads(self._word_maps().project(x_word, 1))
        # G^T V (literal) or its per-word mean (row): values stay in the subword stream.
        v_word = self._heads(project_to_words(v_tokens, graphs, normalize=self.upsample_norm == "row"))
        keep_words = (~graphs.word_pad).view(graphs.word_pad.size(0), 1, 1, -1)
        dropout = self.attention_dropout if self.training else 0.0
        out_word = attention(q_word, k_word, v_word, keep_words, dropout)
        return upsample_tokens(self._merge(out_word), graphs)

    def _fused_map_forward(self, x, x_word, graphs: UMSTGraphs):
        """Training with ``attention_dropout_mode="fused"``: the fused map (ATTN1 + ATTN2') / 2 is built
        (B x H x T x T) and attention dropout drops entries of it, as a transformer drops entries of its
        one map; the relative-value term (RPR) sees ATTN1's share of the same dropped entries."""
        scale = 1.0 / math.sqrt(self.head_dim)
        weight, bias, word_weight, word_bias = self._packed_weights(x.device.type)
        q, k, v = (self._heads(t) for t in F.linear(x, weight, bias).split(self.embed_dim, dim=-1))
        q = q * scale
        scores = torch.matmul(q, k.transpose(-1, -2))
        buckets = None
        if self.rel_keys is not None:
            buckets = self._buckets(graphs, q.size(2), q.device)
            scores = scores + relative_key_logits(q, self.rel_keys.weight, buckets)
        scores = upcast_half(scores).masked_fill(graphs.token_pad[:, None, None, :], float("-inf"))
        a1 = torch.softmax(scores, dim=-1)
        q_word, k_word = F.linear(x_word, word_weight, word_bias).split(self.embed_dim, dim=-1)
        q_word, k_word = self._heads(q_word) * scale, self._heads(k_word)
        word_scores = upcast_half(torch.matmul(q_word, k_word.transpose(-1, -2)))
        a2 = torch.softmax(word_scores.masked_fill(graphs.word_pad[:, None, None, :], float("-inf")), dim=-1)
        fused = 0.5 * (a1 + upsample_attention_map(a2, graphs, normalize=self.upsample_norm == "row"))
        keep = None
        if self.attention_dropout > 0:
            fused, keep = torch.native_dropout(fused, self.attention_dropout, True)
        out = torch.matmul(fused.to(v.dtype), v)
        if buckets is not None:
            a1_share = 0.5 * a1 if keep is None else 0.5 * a1 * keep / (1.0 - self.attention_dropout)
            out = out + relative_value_term(a1_share, self.rel_values.weight, buckets).to(v.dtype)
        return self.out_proj(self._merge(out))

    def attention_maps(self, x, x_word, graphs: UMSTGraphs):
        """Dense (ATTN1, ATTN2, fused map) per head, B x H x T x T (ATTN2: B x H x W x W), for tests and
        visualisation only (no dropout). With relative positions ATTN1's logits include Shaw et al.'s key
        term; their value term is not a map and is not included."""
        scale = 1.0 / math.sqrt(self.head_dim)
        q, k = self._heads(self.in_proj.project(x, 0)) * scale, self._heads(self.in_proj.project(x, 1))
        scores = q @ k.transpose(-1, -2)
        if self.rel_keys is not None:
            buckets = self._buckets(graphs, q.size(2), q.device)
            scores = scores + relative_key_logits(q, self.rel_keys.weight, buckets)
        a1 = torch.softmax(scores.masked_fill(graphs.token_pad[:, None, None, :], float("-inf")), -1)
        word = self._word_maps()
        qw, kw = self._heads(word.project(x_word, 0)) * scale, self._heads(word.project(x_word, 1))
        a2 = torch.softmax((qw @ kw.transpose(-1, -2)).masked_fill(graphs.word_pad[:, None, None, :], float("-inf")), -1)
        bsz, n_slots = graphs.word_pad.shape
        length = graphs.token_pad.size(1)
        # Dense R (B x T x W) from the compact map, for reference only.
        r = torch.zeros(bsz, length, n_slots + 1, dtype=a2.dtype, device=a2.device)
        r.scatter_add_(2, graphs.up_index, graphs.up_weight.to(a2.dtype))
        r = r[:, :, :n_slots]
        cols = r / graphs.up_mass.clamp(min=1e-6).unsqueeze(1) if self.upsample_norm == "row" else r
        a2_up = r.unsqueeze(1) @ a2 @ cols.transpose(1, 2).unsqueeze(1)
        return a1, a2, 0.5 * (a1 + a2_up)
