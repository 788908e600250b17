#!/usr/bin/env python
"""MSC benchmarks: parameter counts vs the paper, training-step time and decoding speed.

    python -m benchmarks paper msc params            # tables 2 and 4 parameter counts
    python -m benchmarks paper msc speed [--device cuda] [--quick]

``params`` builds every row of table 2 (IWSLT, 10k joint BPE vocabulary, all
embeddings shared) and table 4 (WMT14 En-De, 37k joint vocabulary, all
embeddings shared) on the meta device (no memory) and prints our count beside
the paper's.

``speed`` measures, in one run, a training step (forward + backward + Adam
step, label-smoothed CE) and beam-5 decoding tokens/s of msc_base 6x1 and
6x6 against a pre-norm fairseq Transformer of the same depth (6 and 36 encoder
layers, 6 decoder layers), plus decoding of the small (IWSLT) 6-layer
Transformer against MSC 6x12 (the paper: 72 layers decode 26% slower than 6).
Every hypothesis is forced to the same length (min_len = max_len) so tokens/s
compares equal work.
"""

import argparse
import contextlib

import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.sequence_generator import SequenceGenerator

from benchmarks import common
from umst_dev import dev

SMALL = dict(encoder_embed_dim=256, decoder_embed_dim=256, encoder_ffn_embed_dim=512,
             decoder_ffn_embed_dim=512, encoder_attention_heads=4, decoder_attention_heads=4)
BASE = dict(encoder_embed_dim=512, decoder_embed_dim=512, encoder_ffn_embed_dim=2048,
            decoder_ffn_embed_dim=2048, encoder_attention_heads=8, decoder_attention_heads=8)
BIG = dict(encoder_embed_dim=1024, decoder_embed_dim=1024, encoder_ffn_embed_dim=4096,
           decoder_ffn_embed_dim=4096, encoder_attention_heads=16, decoder_attention_heads=16)
PRENORM = dict(encoder_normalize_before=True, decoder_normalize_before=True)


def transformer(dims, enc_layers, dec_layers=6, **extra):
    return "transformer", dict(dims, encoder_layers=enc_layers, decoder_layers=dec_layers, **extra)


def msc(arch, n, m, **extra):
    return arch, dict(encoder_blocks=n, encoder_layers_per_block=m, **extra)


# (table, row label, paper params in millions, vocabulary, (arch, overrides))
PARAM_ROWS = [
    ("2", "small, 6 layers (Transformer)", 10.5, 10000, transformer(SMALL, 6)),
    ("2", "w/ MSC (6x1)", 15.6, 10000, msc("msc_iwslt_de_en", 6, 1)),
    ("2", "MSC, 36 layers (6x6)", 43.3, 10000, msc("msc_iwslt_de_en", 6, 6)),
    ("2", "MSC, 54 layers (6x9)", 60.0, 10000, msc("msc_iwslt_de_en", 6, 9)),
    ("2", "MSC, 72 layers (6x12)", 76.6, 10000, msc("msc_iwslt_de_en", 6, 12)),
    ("4", "TRANSFORMER (base)", 63, 37000, transformer(BASE, 6)),
    ("4", "MSC, 6 layers (base)", 73, 37000, msc("msc_base", 6, 1)),
    ("4", "MSC, 36 layers (base, 6x6)", 215, 37000, msc("msc_base", 6, 6)),
    ("4", "MSC, 48 layers (base, 6x8)", 272, 37000, msc("msc_base", 6, 8)),
    ("4", "TRANSFORMER (big)", 211, 37000, transformer(BIG, 6)),
    ("4", "MSC, 6 layers (big)", 286, 37000, msc("msc_big", 6, 1)),
    ("4", "MSC, 18 layers (big, 6x3)", 512, 37000, msc("msc_big", 6, 3)),
    # Not in the paper's tables: where table 4's base rows would land if the
    # decoder had no context attention/gate (see docs/msc.md).
    ("-", "MSC 6x1 base, decoder w/o context attn", None, 37000, None),
]


def count_params(arch, overrides, vocab, task="translation"):
    overrides = dict(overrides, share_all_embeddings=True)
    with torch.device("meta"):
        model, _ = dev.build_model(arch, overrides, task=task, vocab=vocab)
    return sum(p.numel() for p in model.parameters())


def decoder_context_params(dim):
    """Parameters of one decoder layer's context attention + gate (4 projections + Linear(2d, d))."""
    return 4 * (dim * dim + dim) + (2 * dim * dim + dim)


def run_params():
    print("| table | model | vocab | paper | ours | ours - paper |")
    print("|---|---|---|---|---|---|")
    for table, label, paper, vocab, spec in PARAM_ROWS:
        if spec is None:
            ours = count_params("msc_base", dict(encoder_blocks=6, encoder_layers_per_block=1), vocab)
            ours -= 6 * decoder_context_params(512)
            print(f"| {table} | {label} | {vocab} | - | {ours / 1e6:.1f}M | - |")
            continue
        ours = count_params(*spec, vocab)
        print(f"| {table} | {label} | {vocab} | {paper}M | {ours / 1e6:.1f}M | "
              f"{ours / 1e6 - paper:+.1f}M ({100 * (ours / 1e6 / paper - 1):+.1f}%) |")


# ----------------------------------------------------------------------------
# Speed
# ----------------------------------------------------------------------------


def build(arch, overrides, vocab, device, dtype):
    model, task = dev.build_model(arch, dict(overrides, share_all_embeddings=True, dropout=0.1),
                                  task="translation", vocab=vocab)
    return model.to(device=device, dtype=dtype), task


def train_step_time(arch, overrides, args):
    model, task = build(arch, overrides, args.vocab, args.device, torch.float32)
    sample = dev.move_sample(dev.random_sample(task, args.bsz, args.src_len, args.tgt_len), args.device)
    net_input = dev.model_inputs(model, sample)
    criterion = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()

    def step():
        optimizer.zero_grad(set_to_none=True)
        net_output = model(**net_input)
        loss, _ = criterion.compute_loss(model, net_output, sample, reduce=True)
        loss.backward()
        optimizer.step()

    autocast = (torch.autocast("cuda", dtype=torch.float16) if args.device.startswith("cuda") and args.fp16
                else contextlib.nullcontext())
    with autocast:
        t = common.median_time(step, iters=args.iters, warmup=args.warmup, device=args.device)
    tokens = int(sample["ntokens"])
    del model, optimizer
    return t, tokens


def decode_speed(arch, overrides, args):
    dtype = torch.float16 if args.device.startswith("cuda") and args.fp16 else torch.float32
    model, task = build(arch, overrides, args.vocab, args.device, dtype)
    model.eval()
    sample = dev.move_sample(dev.random_sample(task, args.decode_bsz, args.src_len, args.tgt_len, seed=1),
                             args.device)
    out_len = args.decode_len
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=args.beam,
                                  max_len_a=0, max_len_b=out_len, min_len=out_len)
    net_input = {k: v for k, v in dev.model_inputs(model, sample).items() if k != "prev_output_tokens"}

    def decode():
        with torch.no_grad():
            hyps = generator.generate([model], {"net_input": net_input})
        decode.tokens = sum(len(h[0]["tokens"]) for h in hyps)

    t = common.median_time(decode, iters=args.iters, warmup=1, device=args.device)
    del model
    return decode.tokens / t


SPEED_PAIRS = [
    ("base, 6 enc layers", transformer(BASE, 6, **PRENORM), msc("msc_base", 6, 1)),
    ("base, 36 enc layers", transformer(BASE, 36, **PRENORM), msc("msc_base", 6, 6)),
]
DECODE_ONLY = [
    ("small 6-layer Transformer vs MSC 72 layers (6x12)", transformer(SMALL, 6, **PRENORM),
     msc("msc_iwslt_de_en", 6, 12)),
]


def run_speed(args):
    torch.manual_seed(0)
    print(f"device={args.device} threads={torch.get_num_threads()} vocab={args.vocab} "
          f"train batch={args.bsz}x{args.src_len}->{args.tgt_len} decode batch={args.decode_bsz} "
          f"beam={args.beam} out_len={args.decode_len} fp16={args.fp16 and args.device != 'cpu'}")
    rows = []
    for label, ref, ours in SPEED_PAIRS:
        t_ref, tokens = train_step_time(*ref, args)
        t_msc, _ = train_step_time(*ours, args)
        d_ref = decode_speed(*ref, args)
        d_msc = decode_speed(*ours, args)
        rows.append((label, t_ref, t_msc, d_ref, d_msc, tokens))
    common.print_table(
        "MSC vs pre-norm Transformer of the same depth",
        ["depth", "Transformer train step (ms)", "MSC train step (ms)", "step ratio MSC/T",
         "Transformer decode tok/s", "MSC decode tok/s", "decode ratio MSC/T"],
        [[label, round(t_ref * 1000), round(t_msc * 1000), round(t_msc / t_ref, 2), round(d_ref),
          round(d_msc), round(d_msc / d_ref, 2)] for label, t_ref, t_msc, d_ref, d_msc, _ in rows],
        json_path=args.json)
    for label, ref, ours in DECODE_ONLY:
        d_ref = decode_speed(*ref, args)
        d_msc = decode_speed(*ours, args)
        print(f"decode {label}: {d_ref:.0f} vs {d_msc:.0f} tok/s -> MSC-72 is "
              f"{100 * (1 - d_msc / d_ref):.0f}% slower (paper: 26%, 1800 -> 1340 tok/s on GPU)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("params")
    sp = sub.add_parser("speed", parents=[common.base_argparser(__doc__)], add_help=False,
                        conflict_handler="resolve")
    sp.add_argument("--threads", type=int, default=1)
    sp.add_argument("--iters", type=int, default=3)
    sp.add_argument("--warmup", type=int, default=1)
    sp.add_argument("--vocab", type=int, default=10000)
    sp.add_argument("--bsz", type=int, default=16)
    sp.add_argument("--src-len", type=int, default=24)
    sp.add_argument("--tgt-len", type=int, default=24)
    sp.add_argument("--decode-bsz", type=int, default=8)
    sp.add_argument("--decode-len", type=int, default=20)
    sp.add_argument("--beam", type=int, default=5)
    sp.add_argument("--fp16", action="store_true", help="CUDA only: autocast training, fp16 decoding")
    args = parser.parse_args(argv)
    if args.cmd == "params":
        torch.set_num_threads(1)
        run_params()
        return
    torch.set_num_threads(args.threads)
    if args.quick:
        args.bsz, args.src_len, args.tgt_len, args.decode_bsz, args.decode_len = 2, 6, 6, 2, 4
        args.warmup, args.iters, args.beam = 0, 1, 2
    run_speed(args)


if __name__ == "__main__":
    main()
