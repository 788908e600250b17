"""The two-branch Slow-Fast encoder stack of TranSFormer (sections 3.1-3.3, fig. 3).

Each block, pre-norm throughout (fig. 3 caption):

    fast:  x_f = GCN_f(x_f; A_f)                         (char GCN, Eq. 1, every block)
           x_f = x_f + Drop(SAN_rel(LN(x_f)))             (boundary-wise relative PE)
    slow:  x_s = x_s + Drop(SAN(LN(x_s)))
    fuse:  x_s = x_s + Drop(CGA_s(LN(x_s), LN(x_f)))       (slow queries read the fast branch)
           x_f = x_f + Drop(CGA_f(LN(x_f), LN(x_s)))       (fast queries read the slow branch)
           (both read the other branch's post-SAN states; "sandwiched between SAN and FFN")
    ffn:   x_b = x_b + Drop(FFN(LN(x_b)))  for b in {s, f}

With no interaction layers and the decoder reading the fast branch, nothing reads
the slow branch and none of it is built: that is table 1's "Fast Only" system
(characters in, the fast branch alone, subword decoder).

The slow input is enhanced once by the subword GCN over A_s before the first
block (``slow_gcn='input'``, the paper's "the Slow branch then encodes the
enhanced representation"; ``'every-layer'`` puts one in every block, ``'none'``
drops it). Parameter counts of table 4a match one slow GCN in total, not six.

Sub-layers whose output nothing reads are not built: with the decoder reading
the slow branch, the fast branch's last block needs only its GCN and SAN (its
CGA and FFN would feed nothing), and fast blocks above the last interaction
layer are dropped. This keeps every parameter on the gradient path (DDP with
``find_unused_parameters=False``) and changes the count by < 0.1%.
Tensors are time-first (L x B x C); padding masks are B x L, True at padding. The blocks and the stack take
their sizes and switches as one ``cfg``, a ``SlowFastConfig`` (``umst_plugin/models/transformer_sf/config.py``).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from fairseq.modules import MultiheadAttention

from umst_plugin.modules.common import lean_ops
from umst_plugin.modules.common.group_gcn import GroupGCN
from umst_plugin.modules.transformer_sf.fast_attention import BoundaryRelativeSelfAttention, boundary_band
from umst_plugin.modules.transformer_sf.fusion import CrossGranularityFusion
from umst_plugin.modules.transformer_sf import lean


class PreNormFFN(nn.Module):
    def __init__(self, dim, ffn_dim, dropout, activation_dropout):
        super().__init__()
        self.layer_norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, dim)
        self.dropout, self.activation_dropout = dropout, activation_dropout

    def forward(self, x):
        h = F.dropout(F.relu(self.fc1(self.layer_norm(x))), p=self.activation_dropout, training=self.training)
        return x + F.dropout(self.fc2(h), p=self.dropout, training=self.training)


def _liveness(cfg):
    """Per 1-based layer: which sub-layers of each branch feed the encoder output.

    Returns a list of dicts {'slow': level, 'fast': level} with level in
    {'full', 'attn', None}: 'full' = SAN + fusion + FFN, 'attn' = up to SAN only
    (read by the other branch's fusion in the same block), None = not built."""
    reads = {"slow": "fast", "fast": "slow"}  # receiver -> branch it reads
    receives = {"slow": True, "fast": not cfg.unidirectional}
    needed_end = {"slow": cfg.encoder_output in ("slow", "both"), "fast": cfg.encoder_output in ("fast", "both")}
    levels = [None] * (cfg.layers + 1)
    for layer in range(cfg.layers, 0, -1):
        interact = layer in cfg.interaction_layers
        level = {}
        for branch in ("slow", "fast"):
            other = reads[branch]
            read_by_other = needed_end[other] and interact and receives[other]
            level[branch] = "full" if needed_end[branch] else ("attn" if read_by_other else None)
        levels[layer] = level
        needed_end = {b: level[b] is not None for b in ("slow", "fast")}
    levels[0] = needed_end  # whether each branch's input is used at all
    return levels


def slow_branch_is_read(cfg):
    """False when nothing reads the slow branch (fast only): no slow sub-layer is built."""
    cfg.validate()
    return _liveness(cfg)[0]["slow"]


class SlowFastLayer(nn.Module):
    compile_region = True  # --compile compiles it as one program (umst_plugin/compilation/regions.py)

    def __init__(self, cfg, layer_id: int, level):
        super().__init__()
        interact = layer_id in cfg.interaction_layers
        self.slow_gcn = self.slow_attn = self.slow_attn_norm = self.slow_fusion = self.slow_ffn = None
        self.fast_gcn = self.fast_attn = self.fast_attn_norm = self.fast_fusion = self.fast_ffn = None
        self.dropout = cfg.dropout
        self.recompute_fast = cfg.recompute_fast
        self.lean = cfg.lean
        if level["slow"] is not None:
            if cfg.slow_gcn == "every-layer":
                self.slow_gcn = GroupGCN(cfg.slow_dim, cfg.dropout, cfg.activation_dropout)
            self.slow_attn_norm = nn.LayerNorm(cfg.slow_dim)
            self.slow_attn = MultiheadAttention(cfg.slow_dim, cfg.slow_heads, dropout=cfg.attention_dropout,
                                                self_attention=True)
        if level["slow"] == "full":
            if interact:
                self.slow_fusion = CrossGranularityFusion(cfg.fusion, cfg.slow_dim, cfg.fast_dim, cfg.slow_heads,
                                                          "slow", cfg.attention_dropout)
            self.slow_ffn = PreNormFFN(cfg.slow_dim, cfg.slow_ffn_dim, cfg.dropout, cfg.activation_dropout)
        if level["fast"] is not None:
            if cfg.char_gcn:
                self.fast_gcn = GroupGCN(cfg.fast_dim, cfg.dropout, cfg.activation_dropout)
            self.fast_attn_norm = nn.LayerNorm(cfg.fast_dim)
            self.fast_attn = BoundaryRelativeSelfAttention(cfg.fast_dim, cfg.fast_heads, cfg.attention_dropout,
                                                           cfg.boundary_pe_distance)
        if level["fast"] == "full":
            if interact and not cfg.unidirectional:
                self.fast_fusion = CrossGranularityFusion(cfg.fusion, cfg.fast_dim, cfg.slow_dim, cfg.fast_heads,
                                                          "fast", cfg.attention_dropout)
            self.fast_ffn = PreNormFFN(cfg.fast_dim, cfg.fast_ffn_dim, cfg.dropout, cfg.activation_dropout)

    def _drop(self, x):
        return F.dropout(x, p=self.dropout, training=self.training)

    def _fast(self, fn, *args):
        """A fast-branch sub-layer, recomputed in backward when training with ``recompute_fast``."""
        if self.recompute_fast and self.training and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    def _fast_mixing(self, x_fast, side):
        if self.fast_gcn is not None:
            x_fast = self.fast_gcn(x_fast, side["fast_gcn_groups"], time_first=True,
                                   num_groups=side.get("fast_num_groups"))
        h = self.fast_attn(self.fast_attn_norm(x_fast), side["fast_padding_mask"], side["fast_pe_groups"],
                           use_boundary=side["fast_pe_boundary"])
        return x_fast + self._drop(h)

    def _fast_fused(self, x_fast, fast_mid, slow_mid, side):
        return x_fast + self._drop(self.fast_fusion(fast_mid, slow_mid, side["slow_padding_mask"],
                                                    side["char_token_index"]))

    def forward(self, x_slow, x_fast, side):
        if self.lean:
            return self._forward_lean(x_slow, x_fast, side)
        return self.forward_reference(x_slow, x_fast, side)

    # ------------------------------------------------------------------ lean path
    def _ldrop(self, x):
        return lean_ops.dropout(x, self.dropout, self.training)

    def _fast_attention_lean(self, x_fast, side):
        h = self.fast_attn.forward_lean(x_fast, self.fast_attn_norm, side)
        return x_fast + self._ldrop(h)

    def _fast_fused_lean(self, x_fast, fast_mid, slow_mid, side):
        return x_fast + self._ldrop(self.fast_fusion(fast_mid, slow_mid, side["slow_padding_mask"],
                                                     side["char_token_index"], side["slow_mask"]))

    def _forward_lean(self, x_slow, x_fast, side):
        if self.slow_attn is not None:
            if self.slow_gcn is not None:
                x_slow = lean.lean_gcn(self.slow_gcn, x_slow, side["slow_gcn_rows"], self.training)
            h = self.slow_attn_norm(x_slow)
            if lean.unhooked(self.slow_attn):
                h = lean.multihead_self_attention(self.slow_attn, h, side["slow_mask"], self.training)
            else:
                h, _ = self.slow_attn(query=h, key=h, value=h, key_padding_mask=side["slow_padding_mask"],
                                      need_weights=False)
            x_slow = x_slow + self._ldrop(h)
        if self.fast_attn is not None:
            if self.fast_gcn is not None:  # memory-lean by itself (lean.py): never recomputed
                x_fast = lean.lean_gcn(self.fast_gcn, x_fast, side["fast_gcn_rows"], self.training)
            x_fast = self._fast(self._fast_attention_lean, x_fast, side)
        slow_mid, fast_mid = x_slow, x_fast
        if self.slow_fusion is not None:
            x_slow = x_slow + self._ldrop(self.slow_fusion(slow_mid, fast_mid, side["fast_padding_mask"],
                                                           side["char_token_index"], side["fast_mask"]))
        if self.fast_fusion is not None:
            x_fast = self._fast(self._fast_fused_lean, x_fast, fast_mid, slow_mid, side)
        if self.slow_ffn is not None:
            ffn = self.slow_ffn
            h = lean_ops.dropout(F.relu(ffn.fc1(ffn.layer_norm(x_slow))), ffn.activation_dropout, self.training)
            x_slow = x_slow + lean_ops.dropout(ffn.fc2(h), ffn.dropout, self.training)
        if self.fast_ffn is not None:
            x_fast = lean.lean_ffn(self.fast_ffn, x_fast, self.training)  # memory-lean: never recomputed
        return x_slow, x_fast

    # ------------------------------------------------------------------ reference path
    def forward_reference(self, x_slow, x_fast, side):
        if self.slow_attn is not None:
            if self.slow_gcn is not None:
                x_slow = self.slow_gcn(x_slow, side["slow_groups"], time_first=True,
                                       num_groups=side.get("slow_num_groups"))
            h = self.slow_attn_norm(x_slow)
            h, _ = self.slow_attn(query=h, key=h, value=h, key_padding_mask=side["slow_padding_mask"],
                                  need_weights=False)
            x_slow = x_slow + self._drop(h)
        if self.fast_attn is not None:
            x_fast = self._fast(self._fast_mixing, x_fast, side)
        slow_mid, fast_mid = x_slow, x_fast
        if self.slow_fusion is not None:
            x_slow = x_slow + self._drop(self.slow_fusion(slow_mid, fast_mid, side["fast_padding_mask"],
                                                          side["char_token_index"]))
        if self.fast_fusion is not None:
            x_fast = self._fast(self._fast_fused, x_fast, fast_mid, slow_mid, side)
        if self.slow_ffn is not None:
            x_slow = self.slow_ffn(x_slow)
        if self.fast_ffn is not None:
            x_fast = self._fast(self.fast_ffn, x_fast)
        return x_slow, x_fast


def _num_groups(side, groups, bound):
    """The static bound on the group ids the encoder passes, else (a direct caller) read off the ids."""
    if side.get(bound) is not None:
        return int(side[bound])
    return int(side[groups].max()) + 1 if side[groups].numel() else 1


class SlowFastEncoderStack(nn.Module):
    """Embedded inputs in, final-normed branch outputs out.

    forward(x_slow [T x B x Hs], x_fast [Lf x B x Hf], side) -> (slow_out or None, fast_out or None)
    (x_slow / x_fast may be None when ``uses_slow_input`` / ``uses_fast_input`` is False.)
    ``side`` holds: slow_padding_mask, fast_padding_mask (B x T / B x Lf bool),
    slow_groups (A_s ids, B x T), fast_gcn_groups and fast_pe_groups (A_f ids, B x Lf),
    fast_pe_boundary (bool), char_token_index (B x Lf); optional slow_num_groups /
    fast_num_groups (upper bounds on the group ids, to skip a device sync).
    """

    def __init__(self, cfg):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        levels = _liveness(cfg)
        self.uses_fast_input = levels[0]["fast"]
        self.uses_slow_input = levels[0]["slow"]  # False for fast only (slow_branch_is_read)
        self.slow_input_gcn = (GroupGCN(cfg.slow_dim, cfg.dropout, cfg.activation_dropout)
                               if cfg.slow_gcn == "input" and self.uses_slow_input else None)
        self.layers = nn.ModuleList(SlowFastLayer(cfg, i, levels[i]) for i in range(1, cfg.layers + 1))
        outputs = cfg.encoder_output
        self.slow_layer_norm = nn.LayerNorm(cfg.slow_dim) if outputs in ("slow", "both") else None
        self.fast_layer_norm = nn.LayerNorm(cfg.fast_dim) if outputs in ("fast", "both") else None

    def plan(self, side, x_slow, x_fast):
        """``side`` plus what every block reads, computed once (``lean.py``): the GCNs' group rows, the
        character self-attention's boundary band, the additive key masks of both branches."""
        side = dict(side)
        cfg = self.cfg
        dtype = lean.compute_dtype(x_slow if x_slow is not None else x_fast)
        side["slow_mask"] = lean.additive_mask(side["slow_padding_mask"], dtype)
        side["fast_mask"] = lean.additive_mask(side["fast_padding_mask"], dtype)
        if self.slow_input_gcn is not None or cfg.slow_gcn == "every-layer":
            side["slow_gcn_rows"] = lean.gcn_rows(side["slow_groups"], _num_groups(side, "slow_groups",
                                                                                   "slow_num_groups"))
        if self.uses_fast_input:
            if cfg.char_gcn:
                side["fast_gcn_rows"] = lean.gcn_rows(side["fast_gcn_groups"], _num_groups(side, "fast_gcn_groups",
                                                                                        "fast_num_groups"))
            if cfg.boundary_pe_distance > 0:
                side["fast_band"] = boundary_band(side["fast_pe_groups"], cfg.boundary_pe_distance,
                                                  side["fast_pe_boundary"])
        return side

    def forward(self, x_slow, x_fast, side):
        return self.blocks(*self.prepare(x_slow, x_fast, side))

    def prepare(self, x_slow, x_fast, side):
        """What runs before the first block: the lean path's plan (``plan``) and the subword GCN on the input.
        ``SlowFastEncoder`` runs it in the same region as the embeddings (``SlowFastInput``: one compiled
        program under ``--compile``)."""
        if self.cfg.lean:
            side = self.plan(side, x_slow, x_fast)
            if self.slow_input_gcn is not None:
                x_slow = lean.lean_gcn(self.slow_input_gcn, x_slow, side["slow_gcn_rows"], self.training)
        elif self.slow_input_gcn is not None:
            x_slow = self.slow_input_gcn(x_slow, side["slow_groups"], time_first=True,
                                         num_groups=side.get("slow_num_groups"))
        return x_slow, x_fast, side

    def blocks(self, x_slow, x_fast, side):
        """The blocks and the final layer norms on ``prepare``'s output."""
        for layer in self.layers:
            x_slow, x_fast = layer(x_slow, x_fast, side)
        slow_out = self.slow_layer_norm(x_slow) if self.slow_layer_norm is not None else None
        fast_out = self.fast_layer_norm(x_fast) if self.fast_layer_norm is not None else None
        return slow_out, fast_out
