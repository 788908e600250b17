"""fp32 against bf16 matmul GFLOP/s on this machine: what its bf16 step times can mean.

A CPU's bf16 training times say something about bf16 only where bf16 matmuls have units of their own (AMX, or
AVX512-BF16's dot products); elsewhere torch converts bf16 to fp32 and back and bf16 runs at a fraction of fp32
(docs/mixed-precision.md). This measures it for the record beside a benchmark: the best of 5 rounds of 5 products
per shape and precision, after 3 warm-up products, wall time (nothing else should run), per thread count.

    python -m benchmarks matmul --json docs/results/matmul-cpu-amx.json
    python -m benchmarks matmul --quick                  # small shapes: a smoke run
"""
import argparse
import json
import sys

import torch

from benchmarks import common

# (m, k, n): a 2,048-token batch through d 512 -> 2,048 (the FFN's first product, forward), d 512 -> 4,096, and
# d 2,048 -> 512 (the FFN's second product)
SHAPES = ((2048, 512, 2048), (2048, 512, 4096), (2048, 2048, 512))
QUICK_SHAPES = ((64, 32, 64),)
DTYPES = (("fp32", torch.float32), ("bf16", torch.bfloat16))


def gflops(m, k, n, dtype, device="cpu", rounds=5, per_round=5, warmup=3):
    """The best GFLOP/s of ``rounds`` rounds of ``per_round`` (m x k) @ (k x n) products in ``dtype``."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    for _ in range(warmup):
        a @ b

    def products():
        for _ in range(per_round):
            a @ b
    best = min(common.timed(products, device)[1] for _ in range(rounds)) / per_round  # wall clock
    return 2 * m * k * n / best / 1e9


def measure(shapes=SHAPES, threads=(1, 2), device="cpu", rounds=5):
    """One row per thread count and shape: each precision's GFLOP/s and bf16's over fp32's."""
    rows = []
    before = torch.get_num_threads()
    try:
        for count in threads:
            torch.set_num_threads(count)
            for m, k, n in shapes:
                row = {"threads": count, "m": m, "k": k, "n": n}
                for name, dtype in DTYPES:
                    row[f"{name}_gflops"] = gflops(m, k, n, dtype, device, rounds=rounds)
                row["bf16_over_fp32"] = row["bf16_gflops"] / row["fp32_gflops"]
                rows.append(row)
    finally:
        torch.set_num_threads(before)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts (CPU)")
    p.add_argument("--quick", action="store_true", help="one small shape, one round: a smoke run")
    p.add_argument("--json", default=None, help="write the record here")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",") if t]
    rows = measure(QUICK_SHAPES if args.quick else SHAPES, threads, args.device, rounds=1 if args.quick else 5)
    for row in rows:
        print(f"{row['threads']} thread(s), {row['m']} x {row['k']} @ {row['k']} x {row['n']}: fp32 "
              f"{row['fp32_gflops']:.1f} GFLOP/s, bf16 {row['bf16_gflops']:.1f} GFLOP/s ({row['bf16_over_fp32']:.2f}x)")
    if args.json:
        record = {"device": common.device_name(args.device), "torch": torch.__version__,
                  "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
                  "command": "python -m benchmarks matmul " + " ".join(argv),
                  "rows": rows}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
