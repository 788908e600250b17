"""MSMSA self-attention vs fairseq's MultiheadAttention: forward+backward time and peak memory.

Same input, same process, one run: for N = 64, 256, 1024 tokens per sentence (batches of
``--tokens`` tokens, sentence lengths between 7N/8 and N, left-padded as fairseq does), each
encoder layer of ``msmsa_base`` (d=512, 8 heads, default scales 1,3,N/16,N/8,N/4, alpha 0.5:
its own head allocation per layer) against fairseq's MultiheadAttention of the same size,
both in training mode with the same attention dropout. The ``all 6`` row sums the six layers.

Peak memory on CPU: the high-water mark of live tensor bytes during one forward+backward
call (gradients cleared before it), replayed from every allocation and free the profiler records
(``profile_memory=True``, the raw per-allocation events, in time order): activations kept for
backward, temporaries inside fused kernels, and gradients; not the process RSS, which the
allocator's caching makes meaningless for one call. (``benchmarks.common.peak_memory``.) On CUDA:
``torch.cuda.max_memory_allocated``.

Timing: median over ``--iters`` calls, the two modules called alternately so that load on a
shared machine hits both alike.

    python -m benchmarks paper msmsa --threads 1 [--json out.json] [--quick]
"""
import statistics
import time

import torch
from fairseq.modules import MultiheadAttention

from benchmarks import common
from umst_plugin.modules.msmsa.windowed_attention import (
    DEFAULT_SCALES,
    MultiScaleSelfAttention,
    alpha_head_allocation,
    heads_from_counts,
    parse_scales,
)


def batch(n, tokens, dim, device, seed):
    gen = torch.Generator().manual_seed(seed)
    bsz = max(1, tokens // n)
    lengths = torch.randint(n - n // 8, n + 1, (bsz,), generator=gen)
    lengths[0] = n
    pad = torch.arange(n)[None, :] < (n - lengths)[:, None]  # left padding
    x = torch.randn(n, bsz, dim, generator=gen).masked_fill(pad.t()[:, :, None], 0)
    return x.to(device).requires_grad_(), pad.to(device)


def step_fn(module, x, pad, fairseq_mha):
    def reset():
        module.zero_grad(set_to_none=True)
        x.grad = None

    def step():
        if fairseq_mha:
            out, _ = module(x, x, x, key_padding_mask=pad, need_weights=False)
        else:
            out, _ = module(x, key_padding_mask=pad)
        out.float().sum().backward()
    return reset, step


def peak_memory(reset, step, device):
    """High-water mark of live tensor bytes during one step, above what was live before it."""
    reset()
    return common.peak_memory(step, device)


def alternating_times(step_a, step_b, iters, warmup, device):
    for _ in range(warmup):
        step_a()
        step_b()
    times_a, times_b = [], []
    for _ in range(iters):
        for step, times in ((step_a, times_a), (step_b, times_b)):
            common.sync(device)
            start = time.perf_counter()
            step()
            common.sync(device)
            times.append(time.perf_counter() - start)
    return statistics.median(times_a), statistics.median(times_b)


def main():
    parser = common.base_argparser(__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="64,256,1024")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per batch (batch size = tokens / N)")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--scales", default=DEFAULT_SCALES)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--attention-dropout", type=float, default=0.0, help="as transformer base (0.0)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.tokens, args.iters, args.warmup = "64,256", 1024, 2, 1
    common.setup(args)
    dtype = getattr(torch, args.dtype)
    scales = parse_scales(args.scales)
    allocation = alpha_head_allocation(args.heads, len(scales), args.layers, args.alpha)
    mha = MultiheadAttention(args.dim, args.heads, dropout=args.attention_dropout, self_attention=True)
    mha = mha.to(args.device, dtype).train()
    layers = [MultiScaleSelfAttention(args.dim, args.heads, heads_from_counts(scales, counts),
                                      dropout=args.attention_dropout).to(args.device, dtype).train()
              for counts in allocation]
    print(f"scales {args.scales}, alpha {args.alpha}; heads per scale by layer: {allocation}")
    rows = []
    for n in [int(v) for v in args.lengths.split(",")]:
        x, pad = batch(n, args.tokens, args.dim, args.device, seed=n)
        x = x.detach().to(dtype).requires_grad_()
        base_reset, base_step = step_fn(mha, x, pad, fairseq_mha=True)
        base_step()
        base_mem = peak_memory(base_reset, base_step, args.device) / 2 ** 20
        sums = [0.0] * 4
        for index, (layer, counts) in enumerate(zip(layers, allocation)):
            reset, step = step_fn(layer, x, pad, fairseq_mha=False)
            base_time, t = alternating_times(base_step, step, args.iters, args.warmup, args.device)
            mem = peak_memory(reset, step, args.device) / 2 ** 20
            for i, value in enumerate((base_time, t, base_mem, mem)):
                sums[i] += value
            rows.append([n, x.size(1), f"layer {index + 1} {counts}", base_time * 1e3, t * 1e3, base_time / t,
                         base_mem, mem, mem / base_mem])
        base_time, t, base_total, total = sums
        rows.append([n, x.size(1), f"all {len(layers)}", base_time * 1e3, t * 1e3, base_time / t, base_total, total,
                     total / base_total])
    common.print_table(
        f"MSMSA self-attention vs fairseq MultiheadAttention, fwd+bwd, d={args.dim}, {args.heads} heads, "
        f"{args.tokens} tokens/batch, {args.dtype}, device={args.device}, threads={torch.get_num_threads()}",
        ["N", "batch", "MSMSA layer (heads per scale)", "MHA ms", "MSMSA ms", "speed-up", "MHA peak MiB",
         "MSMSA peak MiB", "memory ratio"], rows, args.json)


if __name__ == "__main__":
    main()
