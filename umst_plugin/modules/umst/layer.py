"""One UMST encoder block (paper section 3, figure 2), pre-norm, batch-first.

    x  <- x + Drop(Â_w . Drop_act(ReLU(Â_w . LN(x) W_w + b)))        intra-group, Eq. 2 (+ left Â_w)
    xw <- DS(x)                                                      subwords -> words, average pooling
    xw <- xw + Drop(ReLU(Â_p . (LN(xw) W_p + b)))                    inter-group, Eq. 3
    x  <- x + Drop(RSAN(LN(x), LN'(xw)))                             rectified self-attention, Eq. 4
    x  <- x + Drop(FFN(LN(x)))

Â = D^-1/2 (A + I) D^-1/2. The residual around each GCN keeps the token identity (the paper: "each
sub-word not only keeps the original meaning, but also derives the corresponding word
boundaries"); Eq. 3 has no extra left multiplication (the paper adds it only to the word GCN).
``phrase_gcn_form="authors"`` computes the phrase GCN as the authors' code does instead (see PhraseGCN).
The word stream gets its own LayerNorm before the word queries/keys, as every pre-norm sub-layer
input does. The word stream is rebuilt from the subword stream in every block (figure 2); only the
subword stream is carried between blocks.

Ablations (tables 5/6, section 6): ``intra_group`` gcn | pool (parameter-free per-word average
pooling) | gat (single-head graph attention of Velickovic et al. over the same-word graph) | None;
``inter_group`` on/off; shared GCN projections are passed in as ``word_proj`` / ``phrase_proj``.

Training memory (``gcn_activations``, see GCN_ACTIVATIONS below): by default the word GCN (operator
gcn) and the phrase GCN run through ``lean_gcn``'s autograd functions (in evaluation too), the
same math and dropout masks as the modules' own forward (which ``store`` and ``recompute`` use).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from umst_plugin.modules.common import lean_ops
from umst_plugin.modules.common.group_gcn import GroupGCN, group_mean
from umst_plugin.modules.common.segment_ops import upcast_half
from umst_plugin.modules.umst.graphs import UMSTGraphs, downsample_words
from umst_plugin.modules.umst.lean_gcn import _operator, lean_phrase_gcn, lean_word_gcn
from umst_plugin.modules.umst.rectified_attention import RectifiedSelfAttention

INTRA_GROUP_OPS = ("gcn", "pool", "gat")
# How training keeps what the GCN blocks' backward needs (same math and dropout masks in all three):
#   lean (default): lean_gcn's hand-written backward keeps the block inputs, LayerNorm statistics
#                   and 1-byte masks, and recomputes only LayerNorm and per-word means;
#   store:          plain autograd keeps every intermediate (reference implementation);
#   recompute:      plain autograd under torch.utils.checkpoint, also around RSAN's word branch:
#                   least memory, re-runs the blocks' matmuls and dropout RNG in backward.
GCN_ACTIVATIONS = ("lean", "store", "recompute")


# The phrase GCN's two forms (see PhraseGCN):
#   eq3 (default): the paper's Eq. 3, one Â_p product;
#   authors:       libeineu/UMST's PhraseTransformer.py, Â_p applied before W_p and again after the ReLU.
PHRASE_GCN_FORMS = ("eq3", "authors")


class PhraseGCN(nn.Module):
    """Pre-norm residual GCN over the normalised dependency adjacency Â_p; ``adj`` is B x W x W (dense,
    see graphs.py).

    ``form="eq3"`` (default), the paper's Eq. 3 with W_p an affine map (``nn.Linear``):

        xw + Drop(ReLU(Â_p . (LN(xw) W_p + b)))

    ``form="authors"``, what the authors' code computes (PhraseTransformer.py L1141-1145; the same
    pattern as their word GCN, with the activation dropout between the two products):

        xw + Drop(Â_p . Drop_act(ReLU((Â_p . LN(xw)) W_p + b)))

    Two differences: the second Â_p product (the paper adds a left multiplication to the word GCN
    only, section 3.2, and writes Eq. 3 with one), and where the bias meets Â_p. In ``eq3`` the bias
    is part of the affine map that Â_p aggregates, so it reaches word i scaled by the row sum
    sum_j Â_p[i, j] = sum_j 1/sqrt(d_i d_j), which is not 1 (a degree-dependent bias); in ``authors``
    it is added once after the first product (and then aggregated by the second). Eq. 3 has no bias
    at all, so neither placement is the paper's; ``eq3`` keeps the placement every UMST checkpoint of
    this plugin was trained with (docs/umst.md, "Differences from the authors' code").
    """

    def __init__(self, embed_dim, dropout=0.0, linear=None, form="eq3", activation_dropout=0.0):
        super().__init__()
        if form not in PHRASE_GCN_FORMS:
            raise ValueError(f"unknown phrase GCN form {form!r}; choose from {PHRASE_GCN_FORMS}")
        self.layer_norm = nn.LayerNorm(embed_dim)
        self.linear = nn.Linear(embed_dim, embed_dim) if linear is None else linear
        self.dropout = dropout
        self.form = form
        self.activation_dropout = activation_dropout  # used by the authors' form only (between the products)

    def forward(self, x_word, adj):
        adj = adj.to(x_word.dtype)
        if self.form == "authors":
            h = F.relu(self.linear(torch.bmm(adj, self.layer_norm(x_word))))
            h = F.dropout(h, p=self.activation_dropout, training=self.training)
            h = torch.bmm(adj, h)
        else:
            h = F.relu(torch.bmm(adj, self.linear(self.layer_norm(x_word))))
        return x_word + F.dropout(h, p=self.dropout, training=self.training)


class WordGAT(nn.Module):
    """Table 5 "replace GCN with GAT": single-head GAT restricted to the same-word graph (with self loops),
    ``x + Drop(ReLU(sum_j alpha_ij W h_j))``, alpha = softmax_j LeakyReLU(a^T [W h_i ; W h_j])."""

    def __init__(self, embed_dim, dropout=0.0, activation_dropout=0.0):
        super().__init__()
        self.layer_norm = nn.LayerNorm(embed_dim)
        self.linear = nn.Linear(embed_dim, embed_dim)
        self.att_src = nn.Parameter(torch.empty(embed_dim))
        self.att_dst = nn.Parameter(torch.empty(embed_dim))
        nn.init.normal_(self.att_src, std=embed_dim ** -0.5)
        nn.init.normal_(self.att_dst, std=embed_dim ** -0.5)
        self.dropout = dropout
        self.activation_dropout = activation_dropout

    def forward(self, x, groups):
        h = self.linear(self.layer_norm(x))  # B x T x C
        scores = (h @ self.att_src).unsqueeze(2) + (h @ self.att_dst).unsqueeze(1)  # B x T x T, one head
        same = (groups.unsqueeze(2) == groups.unsqueeze(1)) & groups.gt(0).unsqueeze(1)
        same = same | torch.eye(groups.size(1), dtype=torch.bool, device=groups.device)  # padding rows: self only
        # the softmax in fp32 for fp16/bf16 scores, as every attention here; float64 stays float64
        scores = F.leaky_relu(upcast_half(scores), 0.2).masked_fill(~same, float("-inf"))
        alpha = F.dropout(torch.softmax(scores, dim=-1), p=self.activation_dropout, training=self.training)
        out = F.relu(torch.bmm(alpha.to(h.dtype), h)).masked_fill(groups.eq(0).unsqueeze(-1), 0.0)
        return x + F.dropout(out, p=self.dropout, training=self.training)


class WordPool(nn.Module):
    """Table 5 "replace GCN with pooling": ``x + Drop(mean over the word's pieces of LN(x))``."""

    def __init__(self, embed_dim, dropout=0.0):
        super().__init__()
        self.layer_norm = nn.LayerNorm(embed_dim)
        self.dropout = dropout

    def forward(self, x, groups):
        return x + F.dropout(group_mean(self.layer_norm(x), groups), p=self.dropout, training=self.training)


class UMSTEncoderLayer(nn.Module):
    reference = False  # True: the plain reference form of the block (see use_reference_path)
    reference_switch = True  # modules.common.lean_ops.use_reference_path switches it
    compile_region = True  # --compile compiles it as one program (umst_plugin/compilation/regions.py)

    def __init__(
        self,
        embed_dim,
        ffn_embed_dim,
        num_heads,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        intra_group="gcn",
        inter_group=True,
        downsample="mean",
        upsample_norm="row",
        share_rsan_qk=False,
        max_relative_positions=0,
        word_proj=None,
        phrase_proj=None,
        share_within_layer=False,
        gcn_activations="lean",
        attention_dropout_mode="per-map",
        phrase_gcn_form="eq3",
    ):
        super().__init__()
        if gcn_activations not in GCN_ACTIVATIONS:
            raise ValueError(f"unknown gcn_activations {gcn_activations!r}; choose from {GCN_ACTIVATIONS}")
        self.gcn_activations = gcn_activations
        if intra_group is not None and intra_group not in INTRA_GROUP_OPS:
            raise ValueError(f"unknown intra-group operator {intra_group!r}; choose from {INTRA_GROUP_OPS}")
        self.dropout = dropout
        self.activation_dropout = activation_dropout
        self.downsample = downsample
        if share_within_layer:  # table 6 row 3: W_w = W_p inside the block
            if word_proj is not None or phrase_proj is not None:
                raise ValueError("share_within_layer and cross-layer projections are mutually exclusive")
            word_proj = phrase_proj = nn.Linear(embed_dim, embed_dim)

        self.intra_group = intra_group
        if intra_group == "gcn":
            self.word_gcn = GroupGCN(embed_dim, dropout, activation_dropout, linear=word_proj)
        elif intra_group == "pool":
            self.word_gcn = WordPool(embed_dim, dropout)
        elif intra_group == "gat":
            self.word_gcn = WordGAT(embed_dim, dropout, activation_dropout)
        else:
            self.word_gcn = None
        self.phrase_gcn = (PhraseGCN(embed_dim, dropout, linear=phrase_proj, form=phrase_gcn_form,
                                     activation_dropout=activation_dropout) if inter_group else None)

        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.word_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.self_attn = RectifiedSelfAttention(
            embed_dim,
            num_heads,
            attention_dropout=attention_dropout,
            upsample_norm=upsample_norm,
            share_qk=share_rsan_qk,
            max_relative_positions=max_relative_positions,
            recompute_word_branch=gcn_activations == "recompute",
            attention_dropout_mode=attention_dropout_mode,
        )
        self.final_layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, ffn_embed_dim)
        self.fc2 = nn.Linear(ffn_embed_dim, embed_dim)

    def upgrade_state_dict_named(self, state_dict, name):
        """Called by fairseq's encoder when loading a checkpoint. The layer's own names never changed; its attention
        packs the projections of older checkpoints itself (``RectifiedSelfAttention.upgrade_state_dict_named``,
        which fairseq's model-wide upgrade calls)."""
        return state_dict

    def _word_gcn_dense(self, x, adj):
        """Eq. 2 with a dense normalised A_w (only for the random-A_w ablation)."""
        gcn = self.word_gcn
        h = F.relu(torch.bmm(adj.to(x.dtype), gcn.linear(gcn.layer_norm(x))))
        h = F.dropout(h, p=self.activation_dropout, training=self.training)
        h = torch.bmm(adj.to(x.dtype), h)
        return x + F.dropout(h, p=self.dropout, training=self.training)

    def _lean(self):
        # Also in evaluation: the same math, with the word GCN's d x d map once per word.
        return self.gcn_activations == "lean"

    def _dense(self, graphs: UMSTGraphs):
        return not self.reference and graphs.down is not None

    def _intra_group(self, x, graphs: UMSTGraphs):
        if graphs.word_adj is not None:
            if self.intra_group != "gcn":
                raise ValueError("word-boundary noise 'random' is defined for the GCN intra-group operator only")
            return self._word_gcn_dense(x, graphs.word_adj)
        if self.intra_group == "gcn" and self._lean() and self._dense(graphs) and graphs.group_adj is not None:
            return lean_word_gcn(self.word_gcn, x, graphs, self.training)
        return self.word_gcn(x, graphs.word_groups)  # the module's plain autograd: store, or the reference

    def _word_stream(self, x, graphs: UMSTGraphs):
        dense = self._dense(graphs)
        if dense and graphs.down_mode == self.downsample:
            x_word = torch.bmm(_operator(graphs.down, x), x)  # one product: per-word mean (or sum / sqrt(n))
        else:
            x_word = downsample_words(x, graphs, self.downsample)
        if self.phrase_gcn is not None:
            adj = graphs.phrase if dense and graphs.phrase is not None else graphs.phrase_adj
            if self._lean() and dense:
                x_word = lean_phrase_gcn(self.phrase_gcn, x_word, adj, self.training)
            else:
                x_word = self.phrase_gcn(x_word, adj)  # the module's plain autograd: store, or the reference
        return self.word_attn_layer_norm(x_word)  # the word branch's pre-norm, recomputed with it

    def _maybe_recompute(self, fn, x, graphs):
        if self.gcn_activations == "recompute" and self.training and torch.is_grad_enabled():
            # Non-reentrant checkpoint restores the RNG state, so dropout masks are identical on recompute.
            return checkpoint(fn, x, graphs, use_reentrant=False)
        return fn(x, graphs)

    def forward(self, x, graphs: UMSTGraphs):
        """x: B x T x C subword stream; returns the next block's subword stream."""
        if self.word_gcn is not None:
            x = self._maybe_recompute(self._intra_group, x, graphs)
        x_word = self._maybe_recompute(self._word_stream, x, graphs)

        if not self._dense(graphs):  # the reference form: F.dropout (three kernels on a CPU)
            h = self.self_attn(self.self_attn_layer_norm(x), x_word, graphs)
            x = x + F.dropout(h, p=self.dropout, training=self.training)
            h = F.relu(self.fc1(self.final_layer_norm(x)))
            h = F.dropout(h, p=self.activation_dropout, training=self.training)
            return x + F.dropout(self.fc2(h), p=self.dropout, training=self.training)

        # torch.native_dropout: the masks F.dropout draws, one kernel on any device
        h = self.self_attn(self.self_attn_layer_norm(x), x_word, graphs)
        x = x + lean_ops.dropout(h, self.dropout, self.training)
        h = lean_ops.dropout(F.relu(self.fc1(self.final_layer_norm(x))), self.activation_dropout, self.training)
        return x + lean_ops.dropout(self.fc2(h), self.dropout, self.training)

