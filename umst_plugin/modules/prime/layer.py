"""The Prime module (Unified Transformer, Zhao et al.): one layer of the encoder or the decoder.

Every branch reads the same input X_{i-1} and the results are summed in one
residual connection followed by one LayerNorm (post-norm):

    encoder:  X_i = LN(X_{i-1} + Attention(X) + Conv(X) + FFN(X))                (Eq. 4; Eq. 1 without Conv)
    decoder:  X_i = LN(X_{i-1} + SelfAttn_causal(X) + Conv_causal(X) + CrossAttn(X, Z) + FFN(X))

with Attention(X) = softmax(Q K^T / sqrt(d_k)) V_A W_2^A (Eq. 2), FFN(X) = max(0, X W_1^F) W_2^F
(Eq. 3), Conv as in :mod:`multi_kernel_dynamic_conv` (Eqs. 5-7). Each branch has its own
dropout on its output. Shared Projection (section 2.1): V_C = V_A, i.e. W_1^C = W_1^A.

Fused form (section 3.3.1): all input projections that read X (W^Q, W^K, W_1^A, [W_1^C],
[decoder W^Q of cross-attention], W_1^F) are rows of one matrix, applied with one matrix
multiply; all output projections (W_2^A, W_2^C, [cross W_2], W_2^F) are columns of one
matrix, applied to the concatenated branch activations with one matrix multiply, which is
the sum of the per-branch projections. The parameters are stored in this fused layout in
both forms, so ``fused`` only selects how it is computed and can be flipped on a trained
model. Per-branch output dropout cannot pass through a single matrix multiply, so while
training with dropout > 0 the output projections are applied branch by branch (still
reading the same fused parameters); the input projection is always fused. At CPU inference with 2-8
rows (beam search at batch size 1), a tall projection is computed as ``W @ x^T`` (see :func:`_linear`).

Beam search: after ``set_beam_size`` (fairseq's SequenceGenerator) the cross-attention keys and values are
cached once per sentence, not once per beam (fairseq's beamable MultiheadAttention convention), when the encoder
marked its output as beam-expanded (``PrimeEncoder.reorder_encoder_out``, from sizes: no host-device sync).

Input dropout (``input_dropout``, the authors' ``--input_dropout``, combine_transformer.py L208 / L516): in
training, dropout on the input of the attention / convolution projections only (W^Q, W^K, W_1^A and a separate
W_1^C); the FFN, the decoder's cross-attention query and the residual read X undropped. The fused input
projection is then two matrix multiplies (the rows that read the dropped X, and the rest).

Biases: one per branch (kept as rows of ``out_proj_bias``) so that the unfused form is
the equations as written; the fused form adds their sum.

Initialisation: ``init="pytorch"`` (default, section 2.1 of the paper: the re-scaled
d=384 model uses PyTorch's default ``nn.Linear`` initialisation, U(+-1/sqrt(fan_in)) for
weights and biases, instead of Xavier) applied per branch with that branch's own fan-in;
``init="xavier"`` gives fairseq's Xavier-uniform weights and zero biases, per branch.

Attention is computed here rather than with ``fairseq.modules.MultiheadAttention``
because that module owns its value projection: it cannot hand V_A to the convolution
(Shared Projection) nor take part in the fused projection. It uses PyTorch's
``scaled_dot_product_attention`` (as fairseq's attention does); padded query rows of the causal
self-attention are allowed to see every key so that no softmax row is fully blocked (a left-padded
decoder position would otherwise give NaN in fp16/bf16). When the probabilities are requested
(alignment) an explicit float32 softmax with finite masking is used.
"""
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor
from torch.autograd.function import once_differentiable

from umst_plugin.modules.common.amp_functions import amp_backward, amp_forward, autocast_cast
from umst_plugin.modules.common.attention import additive_mask, attention
from umst_plugin.modules.common.tracing import compiling
from umst_plugin.modules.prime.multi_kernel_conv import MultiKernelConv
from umst_plugin.modules.common.segment_ops import upcast_half

IncrementalState = Optional[Dict[str, Dict[str, Optional[Tensor]]]]
# Input projection segments read by the self-attention and the convolution (input dropout acts on these).
_BRANCH_INPUT_SEGMENTS = ("q", "k", "v", "v_conv")


@with_incremental_state
class PrimeLayer(nn.Module):
    """One Prime layer (encoder when ``cross_attention`` is False and ``causal`` is False).

    Args:
        embed_dim: model width d.
        num_heads: attention heads (self- and cross-attention).
        ffn_dim: FFN hidden width (ignored when ``ffn_shares_conv_projection``: then d).
        causal: decoder self-attention / convolution only look left; enables incremental decoding.
        cross_attention: add attention over the encoder output as a further parallel branch.
        encoder_dim: width of the encoder output (defaults to ``embed_dim``).
        conv_type: "dynamic" (Prime), "standard" (table 6 ablation) or None (Prime-simple).
        conv_kernels: kernel sizes of the convolution cells mixed by Eq. 7.
        conv_heads: dynamic-convolution heads (default ``num_heads``).
        shared_projection: V_C = V_A (section 2.1). False is table 6's "without Shared Projection".
        ffn: include the FFN branch (False is table 7's "Prime without FFN").
        ffn_shares_conv_projection: table 7's "Share input Projection of FFN with DepthConv": the FFN
            reads relu(V_C) with V_C = X W_1^C its own projection (the attention keeps its own W_1^A,
            so this implies a separate convolution projection), FFN hidden width d.
        dropout: dropout on every branch output (applied separately per branch).
        attention_dropout: dropout on attention probabilities.
        activation_dropout: dropout after the FFN activation.
        input_dropout: dropout on the input of the self-attention and convolution projections only (the
            authors' ``--input_dropout``); the FFN, cross-attention query and residual read X undropped.
        conv_weight_dropout: DropConnect on the dynamic kernels.
        activation_fn: the FFN nonlinearity (ReLU in Eq. 3).
        fused: compute the projections in the fused form (section 3.3.1).
        init: "pytorch" or "xavier" (see module docstring).
    """

    compile_region = True  # --compile compiles it as one program (umst_plugin/compilation/regions.py)

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        ffn_dim: int,
        *,
        causal: bool = False,
        cross_attention: bool = False,
        encoder_dim: Optional[int] = None,
        conv_type: Optional[str] = "dynamic",
        conv_kernels: Sequence[int] = (3, 15),
        conv_heads: Optional[int] = None,
        shared_projection: bool = True,
        ffn: bool = True,
        ffn_shares_conv_projection: bool = False,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        input_dropout: float = 0.0,
        conv_weight_dropout: float = 0.0,
        activation_fn: Callable[[Tensor], Tensor] = F.relu,
        fused: bool = True,
        init: str = "pytorch",
    ):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if ffn_shares_conv_projection and conv_type is None:
            raise ValueError("ffn_shares_conv_projection needs a convolution branch")
        if ffn_shares_conv_projection and not ffn:
            raise ValueError("ffn_shares_conv_projection contradicts ffn=False")
        if init not in ("pytorch", "xavier"):
            raise ValueError(f"init must be 'pytorch' or 'xavier', got {init!r}")
        self.embed_dim = d = embed_dim
        self.num_heads = num_heads
        self.head_dim = d // num_heads
        self.scaling = self.head_dim ** -0.5
        self.causal = causal
        self.has_conv = conv_type is not None
        self.has_cross = cross_attention
        self.has_ffn = ffn
        self.ffn_shares_conv_projection = ffn_shares_conv_projection
        # the FFN-shares-conv ablation keeps the attention path unchanged, so V_C needs its own W_1^C
        self.shared_projection = shared_projection and not ffn_shares_conv_projection
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.input_dropout = input_dropout
        self.activation_fn = activation_fn
        self.fused = fused
        self.init = init

        # Input projection segments (name -> width), all reading X.
        in_segments: List[Tuple[str, int]] = [("q", d), ("k", d), ("v", d)]
        if self.has_conv and not self.shared_projection:
            in_segments.append(("v_conv", d))
        if self.has_cross:
            in_segments.append(("q_cross", d))
        ffn_hidden = d if ffn_shares_conv_projection else ffn_dim
        if ffn and not ffn_shares_conv_projection:
            in_segments.append(("ffn_in", ffn_dim))
        # Output projection segments (branch name -> width of the branch activation).
        out_segments: List[Tuple[str, int]] = [("attn", d)]
        if self.has_conv:
            out_segments.append(("conv", d))
        if self.has_cross:
            out_segments.append(("cross", d))
        if ffn:
            out_segments.append(("ffn", ffn_hidden))
        self.in_segments = in_segments
        # The leading segments read by the self-attention and convolution: the ones input dropout acts on.
        self.n_branch_input_segments = sum(1 for name, _ in in_segments if name in _BRANCH_INPUT_SEGMENTS)
        assert all(name in _BRANCH_INPUT_SEGMENTS for name, _ in in_segments[:self.n_branch_input_segments])
        self.out_segments = out_segments
        self.in_splits = [w for _, w in in_segments]
        self.out_splits = [w for _, w in out_segments]

        self.in_proj_weight = nn.Parameter(torch.empty(sum(self.in_splits), d))
        self.in_proj_bias = nn.Parameter(torch.empty(sum(self.in_splits)))
        self.out_proj_weight = nn.Parameter(torch.empty(d, sum(self.out_splits)))
        self.out_proj_bias = nn.Parameter(torch.empty(len(out_segments), d))
        if self.has_cross:
            self.cross_kv_proj = nn.Linear(encoder_dim or d, 2 * d)
        if self.has_conv:
            self.conv = MultiKernelConv(
                d,
                conv_kernels,
                num_heads=conv_heads or num_heads,
                causal=causal,
                conv_type=conv_type,
                weight_dropout=conv_weight_dropout,
            )
        self.layer_norm = nn.LayerNorm(d)
        # additive attention masks built once per forward pass; PrimeEncoder / PrimeDecoder share one per stack
        self._mask_memo = _MaskMemo()
        self.beam_size = 1  # set by fairseq's set_beam_size before beam search (cross-attention keys shared)
        self.shared_beams = 1  # set by PrimeDecoder.forward from the encoder output's beam mark
        self.reset_parameters()

    # ------------------------------------------------------------------ parameters
    def reset_parameters(self):
        d = self.embed_dim
        with torch.no_grad():
            start = 0
            for _, width in self.in_segments:
                _init_linear_(self.in_proj_weight[start:start + width], self.in_proj_bias[start:start + width],
                              fan_in=d, fan_out=width, init=self.init)
                start += width
            start = 0
            for i, (_, width) in enumerate(self.out_segments):
                _init_linear_(self.out_proj_weight[:, start:start + width], self.out_proj_bias[i],
                              fan_in=width, fan_out=d, init=self.init)
                start += width
            if self.has_cross:
                # K and V of cross-attention are two projections, each initialised as its own Linear
                w, b = self.cross_kv_proj.weight, self.cross_kv_proj.bias
                for half in (slice(0, d), slice(d, 2 * d)):
                    _init_linear_(w[half], b[half], fan_in=w.size(1), fan_out=d, init=self.init)
            if self.has_conv and self.init == "xavier":
                for cell in self.conv.cells:
                    lin = getattr(cell, "weight_linear", None)
                    if lin is not None:
                        nn.init.xavier_uniform_(lin.weight)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        x: Tensor,
        padding_mask: Optional[Tensor] = None,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: IncrementalState = None,
        attn_causal: Optional[bool] = None,
        need_weights: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """
        Args:
            x: T x B x d input.
            padding_mask: B x T, True at padding of x (None: no padding).
            encoder_out: S x B x d_enc (decoder only).
            encoder_padding_mask: B x S, True at encoder padding.
            incremental_state: decoder step-by-step state (x holds the newest step only).
            attn_causal: mask future positions in self-attention; defaults to ``self.causal``
                (fairseq's ``full_context_alignment`` switches it off for the full-sequence pass).
            need_weights / need_head_weights: return the cross-attention probabilities averaged
                over heads (B x T x S) / per head (H x B x T x S).

        Returns: (T x B x d output, cross-attention weights or None)
        """
        if incremental_state is not None and not self.causal:
            raise ValueError("incremental decoding is only defined for a causal (decoder) Prime layer")
        if self.has_cross and encoder_out is None:
            raise ValueError("this Prime layer has cross-attention and needs encoder_out")
        if attn_causal is None:
            attn_causal = self.causal
        residual = x

        # ---- all input projections that read X
        if self.training and self.input_dropout > 0:
            proj = self._project_with_input_dropout(x)
        elif self.fused:
            full = _linear(x, self.in_proj_weight, self.in_proj_bias)
            proj = dict(zip((n for n, _ in self.in_segments), full.split(self.in_splits, dim=-1)))
            if incremental_state is not None:  # K and V are neighbouring segments: one view for the cache
                proj["kv"] = full[..., self.embed_dim:3 * self.embed_dim]
        else:
            # split (not one slice per segment): its backward assembles the full gradient in one concatenation
            weights = self.in_proj_weight.split(self.in_splits, dim=0)
            biases = self.in_proj_bias.split(self.in_splits, dim=0)
            proj = {name: _linear(x, w, b) for (name, _), w, b in zip(self.in_segments, weights, biases)}

        # ---- self-attention (Eq. 2)
        q, k, v = proj["q"], proj["k"], proj["v"]
        conv_reads_cache = (self.has_conv and self.shared_projection and self.conv.conv_type == "dynamic")
        history = None
        if incremental_state is not None:
            # keys and values cached as one S x B x 2d tensor (one concatenation and one reorder per step); with
            # Shared Projection the dynamic convolution reads its window of past inputs from the same cache
            kv_new = proj["kv"] if "kv" in proj else torch.cat([k, v], dim=-1)
            if padding_mask is not None and conv_reads_cache:
                # fairseq's generator never feeds padding step by step; if it came, the convolution must see it
                # zeroed, as in full decoding (the cached values are the convolution's input)
                kv_new = torch.cat([k, v.masked_fill(padding_mask.transpose(0, 1).unsqueeze(-1), 0.0)], dim=-1)
            saved = self.get_incremental_state(incremental_state, "self_attn")
            kv = kv_new if saved is None else torch.cat([saved["kv"], kv_new], dim=0)
            self.set_incremental_state(incremental_state, "self_attn", {"kv": kv})
            d = self.embed_dim
            k, v_attn = kv[..., :d], kv[..., d:]
            history = v_attn if conv_reads_cache else None
            self_mask = None  # the cache only holds the past
        else:
            v_attn = v
            self_mask = self._self_attention_mask(padding_mask, q.size(0), attn_causal, q.dtype, x.device)
        branches: List[Tensor] = [self._attend(q, k, v_attn, self_mask)[0]]

        # ---- convolution (Eqs. 5-7), on the shared V_A or its own V_C
        conv_input = None
        if self.has_conv:
            conv_input = v if self.shared_projection else proj["v_conv"]
            if history is None:
                branches.append(self.conv(conv_input, padding_mask=padding_mask, incremental_state=incremental_state))
            else:
                branches.append(self.conv(conv_input, padding_mask=padding_mask, incremental_state=incremental_state,
                                          history=history))

        # ---- cross-attention over the encoder output
        cross_weights = None
        if self.has_cross:
            ck, cv, cross_mask = self._cross_key_value(encoder_out, encoder_padding_mask, incremental_state,
                                                       proj["q_cross"].dtype)
            q_cross = proj["q_cross"]
            beams = q_cross.size(1) // ck.size(1)  # > 1: the keys are shared by the beams of each sentence
            if beams > 1:  # the beams of a sentence become extra query positions of that sentence
                q_cross = q_cross.unflatten(1, (ck.size(1), beams)).permute(2, 0, 1, 3).flatten(0, 1)  # beams*T x kv_B x d
            out, cross_weights = self._attend(q_cross, ck, cv, cross_mask,
                                              need_weights=need_weights or need_head_weights)
            if beams > 1:
                out = out.unflatten(0, (beams, -1)).permute(1, 2, 0, 3).flatten(1, 2)  # T x B x d
                if cross_weights is not None:  # H x kv_B x beams*T x S -> H x B x T x S
                    cross_weights = cross_weights.unflatten(2, (beams, -1)).flatten(1, 2)
            branches.append(out)
            if cross_weights is not None and not need_head_weights:
                cross_weights = cross_weights.mean(dim=0)

        # ---- point-wise FFN (Eq. 3): the hidden activation; W_2^F comes with the output projection
        if self.has_ffn:
            hidden = self.activation_fn(conv_input if self.ffn_shares_conv_projection else proj["ffn_in"])
            branches.append(F.dropout(hidden, p=self.activation_dropout, training=self.training))

        # ---- output projections, one residual sum, one LayerNorm
        if self.fused and not (self.training and self.dropout > 0):
            y = F.linear(torch.cat(branches, dim=-1), self.out_proj_weight, self._fused_out_bias())
            x = residual + y
        elif self.fused:
            # training with output dropout: each branch's projection (no bias), stacked n x T x B x d, the n biases
            # added at once, one dropout over the stack (an independent mask per branch, as branch by branch) and
            # one sum; the bias gradient is then one reduction, the dropout one op forward and backward
            stacked = self._branch_projections(branches)
            bias = self.out_proj_bias.view(len(branches), 1, 1, -1)
            stacked = stacked + (bias if bias.dtype == stacked.dtype else bias.to(stacked.dtype))  # autocast: half
            x = residual + F.dropout(stacked, p=self.dropout, training=True).sum(0)
        else:
            x = residual
            weights = self.out_proj_weight.split(self.out_splits, dim=1)
            for branch, weight, bias in zip(branches, weights, self.out_proj_bias.unbind(0)):
                x = x + F.dropout(F.linear(branch, weight, bias), p=self.dropout, training=self.training)
        return self.layer_norm(x), cross_weights

    def _branch_projections(self, branches: List[Tensor]) -> Tensor:
        """Each branch through its own columns of the output projection, without bias, stacked n x T x B x d.

        Where every branch is a whole number of d-wide chunks (the attentions and the convolution one, the FFN's
        hidden layer ffn/d: 2 at prime_base), the chunks go through their d x d blocks of ``out_proj_weight`` in
        ONE batched product (:class:`_ChunkedProjection`), and a branch of several chunks sums its chunks'
        products: training then runs one product forward and two backward per layer where a product per branch
        ran n and 2n (n = 3 in the encoder, 4 in the decoder). The same sums of products as
        ``F.linear(branch, weight_i)`` per branch (``tests/test_prime_lean.py``). Otherwise, branch by branch.

        Under ``--compile`` always branch by branch: each product reads its branch where it is, and the compiler
        reads the stack of their outputs in the kernel that adds the biases, drops, sums and normalises (a stack
        of extern outputs feeding element-wise work is not copied), where the batched product first copied every
        branch into one stack, in forward and again in backward for the weight's gradient. It costs launches in
        backward (two products per branch, the weight's gradient assembled from its blocks): on a simulated H200,
        per update of 4,096 tokens of WMT14's lengths, 0.8 GB less memory traffic for 145 more kernels (Prime;
        Prime-simple 0.8 GB, 109), about even there and a gain at the recipe's 38,400 tokens, where the bytes grow
        with the batch and the launches do not (docs/compile.md)."""
        d = self.embed_dim
        if any(w % d for w in self.out_splits) or compiling():
            weights = self.out_proj_weight.split(self.out_splits, dim=1)
            return torch.stack([F.linear(branch, weight) for branch, weight in zip(branches, weights)])
        chunks = tuple(w // d for w in self.out_splits)
        total = sum(chunks)
        # the blocks as c x d_in x d_out views of the d x (c*d) weight (no copy: each block is a transposed matrix)
        weight = autocast_cast(self.out_proj_weight).view(d, total, d).permute(1, 2, 0)
        proj = _ChunkedProjection.apply(weight, chunks, *branches)  # total x T x B x d
        if total == len(branches):
            return proj
        n = len(branches)
        if all(c == 1 for c in chunks[:-1]):  # the FFN, the last branch, alone has several chunks
            return torch.cat([proj[:n - 1], proj[n - 1:].sum(0, keepdim=True)])
        starts = [sum(chunks[:i]) for i in range(n)]
        return torch.stack([proj[s] if c == 1 else proj[s:s + c].sum(0) for s, c in zip(starts, chunks)])

    def _project_with_input_dropout(self, x: Tensor) -> Dict[str, Tensor]:
        """Training with input dropout: the self-attention / convolution projections read Drop(X), the others X
        (one mask, drawn first in the layer as the authors' code does). Fused: one multiply per group of rows."""
        n = self.n_branch_input_segments
        dropped = F.dropout(x, p=self.input_dropout, training=True)
        names = [name for name, _ in self.in_segments]
        if self.fused:
            rows = sum(self.in_splits[:n])
            parts = _linear(dropped, self.in_proj_weight[:rows], self.in_proj_bias[:rows]).split(self.in_splits[:n], -1)
            if n < len(names):
                parts += _linear(x, self.in_proj_weight[rows:], self.in_proj_bias[rows:]).split(self.in_splits[n:], -1)
            return dict(zip(names, parts))
        weights = self.in_proj_weight.split(self.in_splits, dim=0)
        biases = self.in_proj_bias.split(self.in_splits, dim=0)
        return {name: _linear(dropped if i < n else x, w, b)
                for i, (name, w, b) in enumerate(zip(names, weights, biases))}

    def _fused_out_bias(self) -> Tensor:
        """Sum of the branch biases; cached while no gradient is recorded (inference), keyed on the parameter's
        storage and version so that optimizer steps, loading and dtype/device moves refresh it."""
        bias = self.out_proj_bias
        # compiled (--compile's eval programs): dynamo cannot trace the cache's data_ptr() key, and inside a
        # compiled graph the sum fuses into the product's epilogue anyway
        if torch.is_grad_enabled() or compiling():
            return bias.sum(0)
        key = (bias.data_ptr(), bias._version, bias.dtype, bias.device)
        if getattr(self, "_fused_bias_key", None) != key:
            self._fused_bias = bias.sum(0)
            self._fused_bias_key = key
        return self._fused_bias

    def _cross_key_value(
        self, encoder_out: Tensor, encoder_padding_mask: Optional[Tensor], incremental_state: IncrementalState,
        dtype: torch.dtype,
    ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """Cross-attention keys, values and additive key mask (see :meth:`_attend`); computed once per sentence when
        decoding step by step."""
        if incremental_state is not None:
            saved = self.get_incremental_state(incremental_state, "cross_attn")
            if saved is not None:
                return saved["k"], saved["v"], saved.get("mask")
        # Beam search repeats each sentence's encoder output for its beams (fairseq's SequenceGenerator); the
        # Prime encoder marks an encoder output it expanded that way (PrimeEncoder.reorder_encoder_out, from the
        # shapes alone: no host-device sync), and the decoder passes the mark here as ``shared_beams``: keys and
        # values are then computed, cached and reordered once per sentence.
        beams = self.shared_beams if incremental_state is not None and self.beam_size > 1 else 1
        if beams > 1 and encoder_out.size(1) % beams == 0:
            encoder_out = encoder_out[:, ::beams]
        else:
            beams = 1
        ck, cv = self.cross_kv_proj(encoder_out).chunk(2, dim=-1)
        mask = None
        if encoder_padding_mask is not None:
            pad = encoder_padding_mask
            mask = self._mask_memo.get("cross", (pad,), (beams, dtype),
                                       lambda: additive_mask(pad[::beams].unsqueeze(1).unsqueeze(1), dtype))
        if incremental_state is not None:
            saved = {"k": ck.contiguous(), "v": cv.contiguous(), "beams": torch.tensor(beams)}
            if mask is not None:
                saved["mask"] = mask
            self.set_incremental_state(incremental_state, "cross_attn", saved)
        return ck, cv, mask

    def _self_attention_mask(self, padding_mask: Optional[Tensor], T: int, causal: bool, dtype: torch.dtype,
                             device) -> Optional[Tensor]:
        """The additive self-attention mask (B or 1) x 1 x T x T: padded keys and (causal) future positions
        blocked; a padded query row of a causal layer sees every key (only such a row, a left-padded decoder
        position, can be fully blocked, and a fully blocked row is NaN in some kernels; padded rows' outputs are
        never read by valid positions: their keys are blocked and the convolution zeroes them). Built once per
        forward pass and shared by the layers of the stack (``_MaskMemo``)."""
        if padding_mask is None and not causal:
            return None

        def build():
            blocked = _causal_mask(T, T, device).view(1, 1, T, T) if causal else None
            if padding_mask is not None:
                B = padding_mask.size(0)
                keys = padding_mask.view(B, 1, 1, T)
                blocked = keys if blocked is None else (blocked | keys) & ~padding_mask.view(B, 1, T, 1)
            return additive_mask(blocked, dtype)
        return self._mask_memo.get("self_causal" if causal else "self", (padding_mask,), (T, causal, dtype, device),
                                   build)

    def set_beam_size(self, beam_size: int):
        """Called through fairseq's ``set_beam_size`` before beam search: share cross-attention keys across beams."""
        self.beam_size = beam_size

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Optional[Tensor],
        need_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Multi-head scaled dot-product attention. q: T x B x d, k/v: S x B x d; ``mask``: additive, in q's dtype,
        broadcastable to B x 1 x T x S, -inf where blocked (what ``scaled_dot_product_attention`` makes of a
        boolean mask on every call; the layer builds it once per stack, see ``_self_attention_mask`` and
        ``_cross_key_value``)."""
        T, B, d = q.shape
        S = k.size(0)
        H, Dh = self.num_heads, self.head_dim
        if not need_weights:
            # One fused kernel for scaling, masking, softmax (float32 accumulation in half precision), dropout and
            # the weighted sum; fairseq's own attention takes the same kernel.
            out = attention(
                q.reshape(T, B, H, Dh).permute(1, 2, 0, 3), k.reshape(S, B, H, Dh).permute(1, 2, 0, 3),
                v.reshape(S, B, H, Dh).permute(1, 2, 0, 3), mask,
                dropout_p=self.attention_dropout if self.training else 0.0, scale=self.scaling)
            return out.permute(2, 0, 1, 3).reshape(T, B, d), None
        # Explicit path when the probabilities are wanted (alignment): float32 softmax, blocked scores at the
        # dtype's minimum (finite), so even a fully blocked row is a finite uniform average rather than NaN.
        q = (q * self.scaling).contiguous().view(T, B * H, Dh).transpose(0, 1)
        k = k.contiguous().view(S, B * H, Dh).transpose(0, 1)
        v = v.contiguous().view(S, B * H, Dh).transpose(0, 1)
        scores = torch.bmm(q, k.transpose(1, 2))  # B*H x T x S
        scores = upcast_half(scores)
        if mask is not None:
            scores = (scores.view(B, H, T, S) + mask).clamp_(min=torch.finfo(scores.dtype).min).view(B * H, T, S)
        probs = torch.softmax(scores, dim=-1)
        if probs.dtype != v.dtype:
            probs = probs.to(v.dtype)
        out = torch.bmm(F.dropout(probs, p=self.attention_dropout, training=self.training), v)
        out = out.transpose(0, 1).contiguous().view(T, B, d)
        return out, probs.view(B, H, T, S).transpose(0, 1)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Beam search reordering of the attention caches (the convolution reorders its own buffer, if any)."""
        for key in ("self_attn", "cross_attn"):
            saved = self.get_incremental_state(incremental_state, key)
            if saved is None:
                continue
            order = new_order
            beams = int(saved["beams"]) if "beams" in saved else 1
            if beams > 1:  # cross keys shared by each sentence's beams: only finished sentences drop out
                if saved["k"].size(1) * beams == new_order.numel():
                    continue
                order = new_order.view(-1, beams)[:, 0] // beams
            # caches are S x B x (2)d; the cross-attention mask is B x 1 x 1 x S
            self.set_incremental_state(incremental_state, key, {
                name: t if name == "beams" else t.index_select(0 if name == "mask" else 1, order)
                for name, t in saved.items()})


def _stack_chunks(branches: Sequence[Tensor], chunks: Sequence[int]) -> Tensor:
    """The branches' d-wide chunks stacked c x (T*B) x d (a branch T x B x (k*d) gives its k chunks in order)."""
    parts = [b.unsqueeze(0) if c == 1 else b.unflatten(-1, (c, -1)).movedim(-2, 0) for b, c in zip(branches, chunks)]
    stacked = torch.cat(parts)
    return stacked.view(stacked.size(0), -1, stacked.size(-1))


class _ChunkedProjection(torch.autograd.Function):
    """``proj[j] = chunk_j @ weight[j]`` for the branches' d-wide chunks (:func:`_stack_chunks`) as one batched
    product: weight c x d_in x d_out, branches T x B x (k_i * d) -> c x T x B x d_out.

    Keeps the branches themselves for backward, not their stack: the attention branches are views of the fused
    attention's output, which that kernel keeps anyway, so a kept stack would be one more T x B x d copy per
    attention (+19% saved bytes at prime_base); backward stacks them again (one concatenation) for the weight's
    gradient. Follows autocast (``amp_functions``)."""

    @staticmethod
    @amp_forward
    def forward(ctx, weight, chunks, *branches):
        T, B = branches[0].shape[:2]
        ctx.save_for_backward(weight, *branches)
        ctx.chunks = chunks
        return torch.bmm(_stack_chunks(branches, chunks), weight).view(weight.size(0), T, B, weight.size(-1))

    @staticmethod
    @once_differentiable
    @amp_backward
    def backward(ctx, grad):
        weight, *branches = ctx.saved_tensors
        chunks = ctx.chunks
        need = ctx.needs_input_grad
        grad = grad.reshape(grad.size(0), -1, grad.size(-1))  # c x (T*B) x d_out
        grad_weight = torch.bmm(_stack_chunks(branches, chunks).transpose(1, 2), grad) if need[0] else None
        grad_branches = [None] * len(branches)
        if any(need[2:]):
            grad_in = torch.bmm(grad, weight.transpose(1, 2))  # c x (T*B) x d_in
            start = 0
            for i, (branch, c) in enumerate(zip(branches, chunks)):
                if need[2 + i]:
                    g = grad_in[start:start + c]  # c x (T*B) x d_in -> T x B x (c*d_in)
                    grad_branches[i] = (g[0] if c == 1 else g.movedim(0, -2).flatten(-2)).view(branch.shape)
                start += c
        return (grad_weight, None, *grad_branches)


def _linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``F.linear(x, weight, bias)``; at CPU inference with 2-8 rows and a tall weight (out > in features: the
    fused input projection, the FFN's W_1^F) computed as ``weight @ x^T`` instead.

    Beam-search decoding at batch size 1 multiplies 2-8 rows by every weight once per step, so a step costs
    about one read of the weights from memory. For such few rows and a tall weight, MKL's ``x @ weight^T``
    (what F.linear calls) ran at half the speed of ``weight @ x^T`` with the weights out of cache
    (4 rows against 4096 x 512: 1.47 ms vs 0.88 ms; against 2048 x 512: 0.77 vs 0.48 ms); with 1 row they are
    equal, and for a wide weight the gain is small or negative at 8 rows (``python -m benchmarks paper prime --gemm``).
    The result is the same product up to float rounding order.
    """
    # the static conditions first: under torch.compile a comparison of the row count is a guard on the shapes
    if x.device.type == "cpu" and not torch.is_grad_enabled() and weight.size(0) > weight.size(1):
        rows = x.numel() // x.size(-1) if x.size(-1) else 0
        if 2 <= rows <= 8:
            # contiguous again (a few KB): attention kernels take their fast path only with unit-stride features
            out = torch.addmm(bias.unsqueeze(1), weight, x.reshape(rows, -1).t()).t().contiguous()
            return out.view(*x.shape[:-1], weight.size(0))
    if x.dim() == 3 and x.stride(0) < x.stride(1):
        # fairseq hands the first layer a transposed B x T view: one copy, then addmm (F.linear would copy, multiply
        # and add the bias as three kernels)
        x = x.contiguous()
    return F.linear(x, weight, bias)


class _MaskMemo:
    """The attention masks of one stack of layers: every layer of a forward pass gets the same padding mask
    tensor, so the first layer builds each additive mask and the others reuse it. An entry is reused only for the
    very same input tensors (identity, unchanged version) and the same shape, dtype and device arguments; under
    ``torch.compile`` nothing is cached (the compiled layer builds its masks, fused by the compiler)."""

    def __init__(self):
        self._entries: Dict[str, tuple] = {}

    def get(self, name: str, inputs: Tuple[Optional[Tensor], ...], args: tuple, build: Callable[[], Tensor]):
        if compiling():
            return build()
        # (inference tensors keep no version counter: identity alone)
        versions = tuple(None if t is None else (-1 if t.is_inference() else t._version) for t in inputs)
        entry = self._entries.get(name)
        if (entry is not None and entry[2] == args and entry[1] == versions
                and all(a is b for a, b in zip(entry[0], inputs))):
            return entry[3]
        value = build()
        self._entries[name] = (inputs, versions, args, value)
        return value

    def __deepcopy__(self, memo):  # a copied model (EMA, averaging) starts with no cached masks
        return _MaskMemo()


def share_mask_memo(layers) -> None:
    """Let a stack of Prime layers share one mask memo (each builds its own otherwise)."""
    memo = _MaskMemo()
    for layer in layers:
        if isinstance(layer, PrimeLayer):
            layer._mask_memo = memo


def _causal_mask(T: int, S: int, device) -> Tensor:
    """True above the diagonal: position t may not see positions > t (S may exceed T by a prefix)."""
    return torch.ones(T, S, dtype=torch.bool, device=device).triu(S - T + 1)


def _init_linear_(weight: Tensor, bias: Tensor, fan_in: int, fan_out: int, init: str):
    """Initialise a (view of a) linear map as nn.Linear's default, or Xavier-uniform with zero bias."""
    if init == "pytorch":
        bound = 1.0 / math.sqrt(fan_in)  # = kaiming_uniform(a=sqrt(5)) used by nn.Linear
        weight.uniform_(-bound, bound)
        bias.uniform_(-bound, bound)
    else:
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        weight.uniform_(-bound, bound)
        bias.zero_()


# ---- fairseq's encoder / decoder layer calling conventions ---------------------------------------------

class PrimeEncoderLayer(PrimeLayer):
    """fairseq TransformerEncoder-compatible calling convention."""

    def forward(self, x, encoder_padding_mask=None, attn_mask=None):
        if attn_mask is not None:
            raise ValueError("Prime encoder layers do not take an attention mask")
        return super().forward(x, padding_mask=encoder_padding_mask)[0]

    def upgrade_state_dict_named(self, state_dict, name):
        pass


class PrimeDecoderLayer(PrimeLayer):
    """fairseq TransformerDecoder-compatible calling convention."""

    def forward(
        self,
        x,
        encoder_out=None,
        encoder_padding_mask=None,
        incremental_state=None,
        prev_self_attn_state=None,
        prev_attn_state=None,
        self_attn_mask=None,
        self_attn_padding_mask=None,
        need_attn=False,
        need_head_weights=False,
    ):
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise ValueError("Prime decoder layers do not take prev_self_attn_state / prev_attn_state")
        x, attn = super().forward(
            x,
            padding_mask=self_attn_padding_mask,
            encoder_out=encoder_out,
            encoder_padding_mask=encoder_padding_mask,
            incremental_state=incremental_state,
            # fairseq passes its future mask except with full_context_alignment
            attn_causal=incremental_state is None and self_attn_mask is not None,
            need_weights=need_attn,
            need_head_weights=need_head_weights,
        )
        return x, attn, None
