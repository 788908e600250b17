"""TranSFormer (transformer_sf) vs its slow-only baseline: parameters, FLOPs, train-step time, peak memory.

Slow-only baseline = fairseq ``transformer_wmt_en_de`` / ``transformer_vaswani_wmt_en_de_big`` with the
same pre-norm setting, built in the same run from the same 40K shared dictionary.

    python -m benchmarks paper transformer_sf                       # params, FLOPs, speed+memory (base)
    python -m benchmarks paper transformer_sf --only params flops
    python -m benchmarks paper transformer_sf --only speed --batch 16 --src-len 25 --iters 3
    python -m benchmarks paper transformer_sf --only speed --device cuda --batch 64 --size big

Paper figures: params 66M vs 63M (table 1), table 4a widths 16..256 -> 66.6/66.9/67.6/69.7/76.1M vs 63.1M;
FLOPs 1.1G -> 1.4G (base), 3.9G -> 5.0G (big) (table 8, sentence length not stated); +15% training cost.
"""
import argparse
import copy
import json
import random
import re

import torch
import torch.nn as nn
from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from fairseq.tasks.translation import TranslationTask

from benchmarks import common
from umst_dev import dev
from umst_plugin import families

FAMILY = families.get("transformer_sf")

PAPER = {
    "params_base": (66.0, 63.0),
    "width_4a": {16: 66.6, 32: 66.9, 64: 67.6, 128: 69.7, 256: 76.1, "baseline": 63.1},
    "flops_base": (1.4, 1.1),
    "flops_big": (5.0, 3.9),
}
PAIRS = {
    "base": ("transformer_sf_base", "transformer_wmt_en_de"),
    "big": ("transformer_sf_big", "transformer_vaswani_wmt_en_de_big"),
}
PRE_NORM = {"encoder_normalize_before": True, "decoder_normalize_before": True}
# The paper uses attention and activation dropout 0.1 for all its models; fairseq's transformer archs
# default them to 0, so the slow-only baseline gets them explicitly (same regularisation, same cost).
BASELINE_DROPOUTS = {"attention_dropout": 0.1, "activation_dropout": 0.1}


def synthetic_dictionary(size=40000, seed=0):
    """A subword-nmt-like 40K vocabulary: lowercase pieces of 2-7 letters, 40% ending in '@@'.

    Chosen so characters (with separators) run about 5x the subwords, as the paper says of En."""
    rng = random.Random(seed)
    d = Dictionary()
    letters = "abcdefghijklmnopqrstuvwxyzäöüß"
    while len(d) < size:
        piece = "".join(rng.choice(letters) for _ in range(rng.choice([2, 3, 4, 4, 5, 5, 6, 7])))
        d.add_symbol(piece + ("@@" if rng.random() < 0.4 else ""))
    d.finalize(padding_factor=8)
    return d


def build(arch, dictionary, overrides=None):
    argv = ["/dev/null", "--task", "translation", "--arch", arch, "-s", "src", "-t", "tgt", "--share-all-embeddings"]
    argv += dev.overrides_to_argv({**PRE_NORM, **(overrides or {})})
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    torch.manual_seed(0)
    return TranslationTask(args, dictionary, dictionary).build_model(args)


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def sample(dictionary, batch, src_len, tgt_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    lo = dictionary.nspecial
    src = torch.randint(lo, len(dictionary) - 8, (batch, src_len), generator=g)
    src[:, -1] = dictionary.eos()
    prev = torch.randint(lo, len(dictionary) - 8, (batch, tgt_len), generator=g)
    prev[:, 0] = dictionary.eos()
    target = torch.randint(lo, len(dictionary) - 8, (batch, tgt_len), generator=g)
    return src, torch.full((batch,), src_len), prev, target


def char_length(model, src):
    return int(model.encoder.char_table(src).chars.size(1))


# ----------------------------------------------------------------------------- measurements
def bench_params(d):
    rows = {}
    for size, (sf_arch, base_arch) in PAIRS.items():
        n_sf, n_base = n_params(build(sf_arch, d)), n_params(build(base_arch, d))
        rows[size] = {"transformer_sf": n_sf, "slow_only": n_base, "ratio": n_sf / n_base}
    paper_ratio = PAPER["params_base"][0] / PAPER["params_base"][1]
    rows["base"]["paper_ratio"] = paper_ratio
    rows["base"]["ratio_vs_paper"] = rows["base"]["ratio"] / paper_ratio
    widths = {}
    for width in (16, 32, 64, 128, 256):
        n = n_params(build("transformer_sf_base", d, {"fast_embed_dim": width}))
        widths[width] = {"params": n, "delta_vs_slow_only_M": (n - rows["base"]["slow_only"]) / 1e6,
                         "paper_delta_M": PAPER["width_4a"][width] - PAPER["width_4a"]["baseline"]}
    rows["width_4a"] = widths
    return rows


def _sublayer_flops(counts, pattern):
    rx = re.compile(r"layers\.\d+\.(" + pattern + r")$")
    return sum(sum(v.values()) for k, v in counts.items() if rx.search(k))


def bench_flops(d, src_len, tgt_len):
    """Forward FLOPs (torch.utils.flop_counter: 2 per multiply-add, matmuls only) of one sentence of
    ``src_len`` subwords (and ``tgt_len`` target subwords for the full model). Table 8's baseline
    figures (1.1G base, 3.9G big) equal the *encoder* FLOPs at ~25 subwords, so we report both."""
    from torch.utils.flop_counter import FlopCounterMode

    rows = {}
    for size, (sf_arch, base_arch) in PAIRS.items():
        res = {"src_len": src_len, "tgt_len": tgt_len}
        for name, arch in (("transformer_sf", sf_arch), ("slow_only", base_arch)):
            model = build(arch, d).eval()
            src, lengths, prev, _ = sample(d, 1, src_len, tgt_len)
            with torch.no_grad(), FlopCounterMode(display=False) as full:
                model(src, lengths, prev)
            with torch.no_grad(), FlopCounterMode(display=False) as enc:
                model.encoder(src, lengths)
            res[f"{name}_full_G"] = full.get_total_flops() / 1e9
            res[f"{name}_encoder_G"] = enc.get_total_flops() / 1e9
            if name == "transformer_sf":
                counts = enc.get_flop_counts()
                res["char_len"] = char_length(model, src)
                res["fast_branch_G"] = _sublayer_flops(counts, r"fast_\w+") / 1e9
                res["slow_cga_G"] = _sublayer_flops(counts, r"slow_fusion") / 1e9
            del model
        paper_sf, paper_base = PAPER[f"flops_{size}"]
        res.update(encoder_ratio=res["transformer_sf_encoder_G"] / res["slow_only_encoder_G"],
                   full_ratio=res["transformer_sf_full_G"] / res["slow_only_full_G"],
                   paper=f"{paper_base}G -> {paper_sf}G", paper_ratio=paper_sf / paper_base)
        rows[size] = res
    return rows


def _fixed_length_sample(task, batch, src_len, tgt_len, device):
    dataset = dev.random_dataset(task, batch, src_len, tgt_len, seed=0, min_len=src_len)
    sample_ = dev.collate(dataset, range(batch))
    for key in ("src_word_ids", "src_word_heads"):  # neither model reads side data (plain translation)
        sample_["net_input"].pop(key, None)
    return dev.move_sample(sample_, device)


def bench_speed_memory(d, batch, src_len, tgt_len, iters, warmup, device, size="base", rounds=3):
    """Train step (forward + backward) time, generation time (beam 4) and peak memory of one train
    step, TranSFormer vs slow-only, on the same fixed-length batch. Timing alternates the two models
    for ``rounds`` rounds and keeps each model's best median, so load on a shared CPU hits both alike."""
    sf_arch, base_arch = PAIRS[size]
    built = {}
    for name, arch in (("transformer_sf", sf_arch), ("slow_only", base_arch)):
        extra = BASELINE_DROPOUTS if name == "slow_only" else {}
        model, task = dev.build_model(arch, {**PRE_NORM, **extra, "share_all_embeddings": True},
                                      task="translation", dictionary=d)
        built[name] = (model.to(device), task)
    sample_ = _fixed_length_sample(built["slow_only"][1], batch, src_len, tgt_len, device)
    step_times = {name: [] for name in built}
    gen_times = {name: [] for name in built}
    for _ in range(rounds):
        for name, (model, task) in built.items():
            model.train()
            step_times[name].append(common.median_time(common.train_step_fn(model, sample_), iters, warmup, device))
            model.eval()
            gen, _ = common.generate_fn(model, task, sample_, beam=4, max_len_b=10)
            gen_times[name].append(common.median_time(gen, max(1, iters // 2), 1, device))
    memory = {}
    for name, (model, _) in built.items():
        model.train()
        memory[name] = common.peak_memory(common.train_step_fn(model, sample_), device) / 2 ** 20
    sf_model = built["transformer_sf"][0]
    char_len = int(sf_model.encoder.char_table(sample_["net_input"]["src_tokens"]).chars.size(1))
    step = {k: min(v) for k, v in step_times.items()}
    gen = {k: min(v) for k, v in gen_times.items()}
    return {
        "device": str(device), "threads": torch.get_num_threads(), "batch": batch, "src_len": src_len,
        "tgt_len": tgt_len, "char_len": char_len,
        "train_step_s": step, "train_step_ratio": step["transformer_sf"] / step["slow_only"],
        "paper_train_ratio": 1.15,
        "generate_s": gen, "generate_ratio": gen["transformer_sf"] / gen["slow_only"],
        "peak_train_step_MiB": memory, "memory_ratio": memory["transformer_sf"] / memory["slow_only"],
    }


def main():
    parser = common.base_argparser(__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--only", nargs="*", default=["params", "flops", "speed"])
    parser.add_argument("--src-len", type=int, default=25, help="source/target subwords per sentence")
    parser.add_argument("--batch", type=int, default=16, help="sentences per train step / generate call")
    parser.add_argument("--size", choices=tuple(PAIRS), default="base", help="model size for the speed section")
    args = parser.parse_args()
    if args.threads is None and args.device == "cpu":
        args.threads = 1  # the shared 2-core box; pass --threads to change
    common.setup(args)
    d = synthetic_dictionary()
    results = {}
    if "params" in args.only:
        p = results["params"] = bench_params(d)
        common.print_table("Parameters at a 40K shared vocabulary (paper: 66M vs 63M, ratio 1.048)",
                           ["size", "transformer_sf", "slow-only", "ratio", "ratio / paper ratio"],
                           [[k, p[k]["transformer_sf"], p[k]["slow_only"], p[k]["ratio"],
                             p[k].get("ratio_vs_paper", "-")] for k in PAIRS])
        common.print_table("Fast width (table 4a): added parameters vs slow-only",
                           ["H_f", "params", "added (M)", "paper added (M)"],
                           [[w, v["params"], v["delta_vs_slow_only_M"], v["paper_delta_M"]]
                            for w, v in p["width_4a"].items()])
    if "flops" in args.only:
        f = results["flops"] = bench_flops(d, args.src_len, args.src_len)
        common.print_table(f"Forward FLOPs, one sentence of {args.src_len} subwords (table 8)",
                           ["size", "chars", "slow-only enc G", "sf enc G", "enc ratio", "paper ratio",
                            "slow-only full G", "sf full G", "full ratio", "fast branch G", "slow CGA G"],
                           [[k, v["char_len"], v["slow_only_encoder_G"], v["transformer_sf_encoder_G"],
                             v["encoder_ratio"], v["paper_ratio"], v["slow_only_full_G"],
                             v["transformer_sf_full_G"], v["full_ratio"], v["fast_branch_G"], v["slow_cga_G"]]
                            for k, v in f.items()])
    if "speed" in args.only:
        t = results["speed"] = bench_speed_memory(d, args.batch, args.src_len, args.src_len, args.iters,
                                                  args.warmup, args.device, args.size)
        common.print_table(
            f"{args.size}: train step / generate (beam 4) / peak train-step memory, batch {args.batch} x "
            f"{args.src_len} subwords ({t['char_len']} chars), {t['device']}, {t['threads']} thread(s)",
            ["model", "train step s", "generate s", "peak MiB"],
            [[k, t["train_step_s"][k], t["generate_s"][k], t["peak_train_step_MiB"][k]]
             for k in ("transformer_sf", "slow_only")]
            + [["ratio", t["train_step_ratio"], t["generate_ratio"], t["memory_ratio"]]])
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, default=str)


# ---- the floor of TranSFormer's shape for ``python -m benchmarks launches --floor``: ``transformer_sf_shape`` ----
#
# The floor of TranSFormer's shape for ``bench_launches.py --floor``: ``transformer_sf_shape``.
#
# TranSFormer's encoder runs two branches of 6 blocks each, the subword one at width 512 and the character one at
# width 32 over a sequence 5-6 times longer, and each block has a cross-attention per direction. Whatever its layers
# do, that shape launches more kernels per FLOP than fairseq's 6+6 transformer: the character branch's products
# launch as many kernels as the subword branch's for a sixteenth of the work. This model is what the shape alone
# costs: ``transformer_sf_base`` (the same embeddings, character table, subword decoder, dropouts) whose encoder
# stack is made of fairseq's own transformer layers, nothing of TranSFormer's:
#
# * subword block i: fairseq's ``TransformerDecoderLayerBase`` at 512 / 2048 / 8 heads, its self-attention without
#   the causal mask, its cross-attention reading the character branch (keys and values of width 32, fairseq's
#   ``MultiheadAttention`` with ``kdim = vdim = 32``): self-attention, cross-attention, FFN, as TranSFormer's block;
# * character block i < 6: the same layer at 32 / 128 / 2 heads reading the subword branch (``kdim = 512``);
# * character block 6: fairseq's ``TransformerEncoderLayerBase`` (self-attention and FFN; TranSFormer's last
#   character block has its self-attention only, which the last subword cross-attention reads);
# * the subword branch's final LayerNorm, as TranSFormer's.
#
# No GCN, no relative positions, no layer norm of the other branch before a cross-attention. Registered only in the
# benchmark's process (importing this module), not by the plugin.

NAME = "transformer_sf_shape"


def _layer_config(args, width, ffn, heads, other_width):
    cfg = copy.deepcopy(TransformerConfig.from_namespace(args))
    for part in (cfg.encoder, cfg.decoder):
        part.embed_dim, part.ffn_embed_dim, part.attention_heads = width, ffn, heads
        part.normalize_before = True
    cfg.encoder.embed_dim = other_width  # what the decoder layer's cross-attention reads (kdim, vdim)
    return cfg


class PlainShapeStack(nn.Module):
    """``SlowFastEncoderStack``'s interface (embedded branches and ``side`` in, the final-normed slow branch out)
    with fairseq's transformer layers in TranSFormer's shape."""

    def __init__(self, args):
        super().__init__()
        slow, fast, layers = args.encoder_embed_dim, args.fast_embed_dim, args.encoder_layers
        slow_cfg = _layer_config(args, slow, args.encoder_ffn_embed_dim, args.encoder_attention_heads, fast)
        fast_cfg = _layer_config(args, fast, args.fast_ffn_embed_dim, args.fast_attention_heads, slow)
        self.slow_layers = nn.ModuleList(TransformerDecoderLayerBase(slow_cfg) for _ in range(layers))
        fast_last_cfg = copy.deepcopy(fast_cfg)
        fast_last_cfg.encoder.embed_dim = fast
        self.fast_layers = nn.ModuleList([TransformerDecoderLayerBase(fast_cfg) for _ in range(layers - 1)]
                                         + [TransformerEncoderLayerBase(fast_last_cfg)])
        self.slow_layer_norm = nn.LayerNorm(slow)

    def forward(self, x_slow, x_fast, side):
        return self.blocks(*self.prepare(x_slow, x_fast, side))

    def prepare(self, x_slow, x_fast, side):
        return x_slow, x_fast, side  # nothing shared between the blocks to build

    def blocks(self, x_slow, x_fast, side):
        slow_mask, fast_mask = side["slow_padding_mask"], side["fast_padding_mask"]
        for slow_layer, fast_layer in zip(self.slow_layers, self.fast_layers):
            slow_in = x_slow
            if isinstance(fast_layer, TransformerEncoderLayerBase):
                x_fast = fast_layer(x_fast, fast_mask)
            x_slow = slow_layer(x_slow, x_fast, fast_mask, self_attn_padding_mask=slow_mask)[0]
            if isinstance(fast_layer, TransformerDecoderLayerBase):
                x_fast = fast_layer(x_fast, slow_in, slow_mask, self_attn_padding_mask=fast_mask)[0]
        return self.slow_layer_norm(x_slow), None


class PlainShapeEncoder(FAMILY.encoder):
    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(args, dictionary, embed_tokens)
        self.stack = PlainShapeStack(args)


def register():
    """Register the model and its arch (once) in this process."""
    if NAME in ARCH_MODEL_REGISTRY:
        return

    @register_model(NAME)
    class TransformerSlowFastShapeModel(FAMILY.model):
        @classmethod
        def build_encoder(cls, args, src_dict, embed_tokens):
            return PlainShapeEncoder(args, src_dict, embed_tokens)

    register_model_architecture(NAME, NAME)(ARCH_CONFIG_REGISTRY["transformer_sf_base"])


SHAPE_ROWS = {NAME: dict(arch=NAME, overrides={}, quick=dict(FAMILY.bench_rows["transformer_sf"].quick),
                         label="transformer layers, transformer_sf_base's shape (6+6 enc at d 512 and 32, 6 dec)",
                         floor_of=["transformer_sf"], register=register)}


if __name__ == "__main__":
    main()
