"""UMST vs pre-norm ``transformer_wmt_en_de``: parameters, training-step time, beam-4 generation
speed and peak memory, same batch, same dims, same machine, one run.

    python -m benchmarks paper umst                       # base dims (512/2048, 6+6), 40K shared vocab
    python -m benchmarks paper umst --only time --rounds 5 --batch 16 --src-len 30
    python -m benchmarks paper umst --arch umst_base_rpr  # any umst arch / flags after --extra
    python -m benchmarks paper umst --extra --gcn-activations store   # plain autograd (or recompute)

Targets (issue 4): train step <= 1.15x (paper table 7: 1.25x), generate tokens/s >= 0.97x (paper
136.67/142.33 = 0.96x), peak memory <= 1.10x (paper 6.7G/6.4G = 1.05x).

Method: both models are built from the same 40K dictionary with the same seed; the source batch and its
side data (1-3 pieces per word, random dependency trees) are shared. Timed steps alternate the two
models one by one (after a warm-up step each) so load on a shared machine hits both alike; medians of
wall time and of process CPU time are reported (with one thread, CPU time is the robust figure on a
shared CPU; on CUDA, use wall time). Generation is forced to a fixed
output length (min_len = max_len) so both models emit exactly the same number of tokens. Memory:
``benchmarks/common.peak_memory`` of one forward+backward (CUDA ``max_memory_allocated``; on CPU the
high-water mark of live tensor bytes from the profiler's allocation events), i.e. activations +
gradients beyond the resident model, plus the bytes of the tensors autograd saves for backward.
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch

from fairseq import options
from fairseq.data import Dictionary
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationTask

import umst_plugin  # noqa: F401  (registers the archs)

BASELINE = "transformer_wmt_en_de"
PRE_NORM = ["--encoder-normalize-before", "--decoder-normalize-before"]
# The baseline gets UMST's dropouts (appendix A.2: all 0.1) so both models do the same regularisation work.
BASELINE_FLAGS = ["--attention-dropout", "0.1", "--activation-dropout", "0.1"]
# --dims small: a quick smoke configuration; the reported figures use the default base dims.
SMALL = ["--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
         "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
         "--encoder-layers", "2", "--decoder-layers", "2"]
DIMS = {"base": [], "small": SMALL}


def synthetic_dictionary(size=40000):
    d = Dictionary()
    i = 0
    while len(d) < size:
        d.add_symbol(f"p{i}@@" if i % 3 == 0 else f"w{i}")
        i += 1
    return d


def build(arch, d, extra=(), device="cpu", dims="base"):
    argv = ["/dev/null", "--task", "translation", "--arch", arch, "-s", "src", "-t", "tgt",
            "--share-all-embeddings", *PRE_NORM, *DIMS[dims], *extra]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    torch.manual_seed(0)
    model = TranslationTask(args, d, d).build_model(args)
    return model if device == "meta" else model.to(device)


def make_batch(d, batch, src_len, tgt_len, seed=0, device="cpu"):
    """Full-length sentences (no padding, like a length-bucketed batch) with side data."""
    rng = np.random.RandomState(seed)
    src = torch.from_numpy(rng.randint(d.nspecial, len(d), size=(batch, src_len))).long()
    src[:, -1] = d.eos()
    word_ids = torch.zeros(batch, src_len, dtype=torch.long)
    heads_list = []
    for b in range(batch):  # cheap host-side data synthesis, not part of any timing
        pieces, total = [], 0
        while total < src_len - 1:
            p = min(int(rng.choice([1, 1, 1, 2, 2, 3])), src_len - 1 - total)
            pieces.append(p)
            total += p
        n = len(pieces)
        order = rng.permutation(n)
        heads = [0] * n
        for k, w in enumerate(order[1:], start=1):
            heads[w] = int(order[rng.randint(k)]) + 1
        word_ids[b] = torch.tensor([w + 1 for w, p in enumerate(pieces) for _ in range(p)] + [n + 1])
        heads_list.append(heads + [0])
    n_slots = max(len(h) for h in heads_list)
    word_heads = torch.full((batch, n_slots), -1, dtype=torch.long)
    for b, h in enumerate(heads_list):
        word_heads[b, : len(h)] = torch.tensor(h)
    prev = torch.from_numpy(rng.randint(d.nspecial, len(d), size=(batch, tgt_len))).long()
    prev[:, 0] = d.eos()
    target = torch.from_numpy(rng.randint(d.nspecial, len(d), size=(batch, tgt_len))).long()
    net_input = {"src_tokens": src, "src_lengths": torch.full((batch,), src_len),
                 "src_word_ids": word_ids, "src_word_heads": word_heads}
    return {k: v.to(device) for k, v in net_input.items()}, prev.to(device), target.to(device)


def _inputs_for(model, net_input):
    if model.__class__.__name__ == "UMSTModel":
        return net_input
    return {k: v for k, v in net_input.items() if k in ("src_tokens", "src_lengths")}


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def train_step(model, opt, net_input, prev, target):
    logits, _ = model(**_inputs_for(model, net_input), prev_output_tokens=prev)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), target.view(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()


class Clock:
    """Wall time and this process's CPU time of one call. On a shared CPU (other jobs competing for the
    cores) the CPU time of a single-threaded run is the robust figure: it counts only the cycles this
    process got, whereas wall time also counts the time it waited for a core."""

    def __init__(self, device):
        self.device = device

    def __call__(self, fn):
        _sync(self.device)
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        _sync(self.device)
        return time.perf_counter() - w0, time.process_time() - c0, out


def bench_speed(args, d, device):
    models = {"umst": build(args.arch, d, args.extra, device, args.dims),
              "transformer": build(BASELINE, d, BASELINE_FLAGS, device, args.dims)}
    batch = make_batch(d, args.batch, args.src_len, args.src_len, device=device)
    gen_input, _, _ = make_batch(d, args.gen_batch, args.src_len, args.src_len, seed=1, device=device)
    clock = Clock(device)
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-5) for k, m in models.items()}
    gens = {k: SequenceGenerator([m], d, beam_size=4, max_len_a=0, max_len_b=args.src_len, min_len=args.src_len)
            for k, m in models.items()}
    train = {k: {"wall": [], "cpu": []} for k in models}
    gen = {k: {"wall": [], "cpu": []} for k in models}
    n_tok = {}
    # Alternate the two models step by step (after one warm-up step each) so that load changes on a
    # shared machine hit both alike; report medians.
    for i in range(1 + args.rounds * args.repeats):
        for name, model in models.items():
            if "time" in args.only:
                model.train()
                wall, cpu, _ = clock(lambda: train_step(model, opts[name], *batch))
                if i > 0:
                    train[name]["wall"].append(wall)
                    train[name]["cpu"].append(cpu)
            if "generate" in args.only:
                model.eval()
                sample = {"net_input": _inputs_for(model, gen_input)}
                with torch.no_grad():
                    wall, cpu, hyps = clock(lambda: gens[name].generate([model], sample))
                n_tok[name] = sum(len(h[0]["tokens"]) for h in hyps)
                if i > 0:
                    gen[name]["wall"].append(n_tok[name] / wall)
                    gen[name]["cpu"].append(n_tok[name] / cpu)
    med = statistics.median
    out = {}
    if "time" in args.only:
        out["train_step_s"] = {k: {m: med(v[m]) for m in v} for k, v in train.items()}
        out["train_ratio_cpu"] = out["train_step_s"]["umst"]["cpu"] / out["train_step_s"]["transformer"]["cpu"]
        out["train_ratio_wall"] = out["train_step_s"]["umst"]["wall"] / out["train_step_s"]["transformer"]["wall"]
    if "generate" in args.only:
        assert n_tok["umst"] == n_tok["transformer"], n_tok
        out["generate_tokens_per_s"] = {k: {m: med(v[m]) for m in v} for k, v in gen.items()}
        out["generated_tokens"] = n_tok["umst"]
        g = out["generate_tokens_per_s"]
        out["generate_ratio_cpu"] = g["umst"]["cpu"] / g["transformer"]["cpu"]
        out["generate_ratio_wall"] = g["umst"]["wall"] / g["transformer"]["wall"]
    return out


def saved_activation_bytes(step):
    """Bytes of the distinct storages autograd saves for backward during one training step."""
    saved = {}

    def pack(t):
        try:
            storage = t.untyped_storage()
            saved[storage.data_ptr()] = max(saved.get(storage.data_ptr(), 0), storage.nbytes())
        except (RuntimeError, NotImplementedError):
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(saved.values())


def bench_memory(args, d, device):
    """Peak bytes allocated by one forward+backward (activations + gradients; see benchmarks/common.py)."""
    from benchmarks.common import peak_memory

    out = {}
    for name, arch, extra in (("umst", args.arch, args.extra), ("transformer", BASELINE, BASELINE_FLAGS)):
        model = build(arch, d, extra, device, args.dims).train()
        net_input, prev, target = make_batch(d, args.batch, args.src_len, args.src_len, device=device)

        def step():
            model.zero_grad(set_to_none=True)
            logits, _ = model(**_inputs_for(model, net_input), prev_output_tokens=prev)
            torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), target.view(-1)).backward()

        step()  # warm-up
        out[name] = {"peak_mb": peak_memory(step, device) / 2 ** 20,
                     "saved_activation_mb": saved_activation_bytes(step) / 2 ** 20}
        del model
    out["peak_ratio"] = out["umst"]["peak_mb"] / out["transformer"]["peak_mb"]
    out["activation_ratio"] = out["umst"]["saved_activation_mb"] / out["transformer"]["saved_activation_mb"]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="umst_base")
    p.add_argument("--only", nargs="*", default=["params", "time", "generate", "memory"])
    p.add_argument("--batch", type=int, default=16, help="training batch (sentences)")
    p.add_argument("--gen-batch", type=int, default=8, help="generation batch (sentences), beam 4")
    p.add_argument("--src-len", type=int, default=30, help="source and target subwords per sentence")
    p.add_argument("--repeats", type=int, default=3, help="timed steps = rounds x repeats, alternating models")
    p.add_argument("--rounds", type=int, default=2, help="(see --repeats); medians are reported")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dims", choices=sorted(DIMS), default="base", help="base (reported) or small (smoke test)")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="extra model flags for the UMST arch")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    d = synthetic_dictionary()
    results = {"device": torch.cuda.get_device_name() if device == "cuda" else f"cpu, {args.threads} thread(s)",
               "arch": args.arch, "dims": args.dims, "extra": args.extra, "batch": args.batch, "gen_batch": args.gen_batch,
               "src_len": args.src_len}
    if "params" in args.only:
        with torch.device("meta"):
            n = {k: sum(p.numel() for p in build(a, d, e, "meta", args.dims).parameters())
                 for k, a, e in (("umst", args.arch, args.extra), ("transformer", BASELINE, BASELINE_FLAGS))}
        results["params"] = n
    if {"time", "generate"} & set(args.only):
        results.update(bench_speed(args, d, device))
    if "memory" in args.only:
        results["memory"] = bench_memory(args, d, device)
    print(json.dumps(results, indent=1))
    summary = []
    if "train_ratio_cpu" in results:
        summary.append(f"train step {results['train_ratio_cpu']:.3f}x CPU time, {results['train_ratio_wall']:.3f}x "
                       "wall (target <= 1.15, paper 1.25)")
    if "generate_ratio_cpu" in results:
        summary.append(f"generate {results['generate_ratio_cpu']:.3f}x tokens/CPU-s, "
                       f"{results['generate_ratio_wall']:.3f}x tokens/wall-s (target >= 0.97, paper 0.96)")
    if "memory" in results:
        summary.append(f"peak memory {results['memory']['peak_ratio']:.3f}x (target <= 1.10, paper 1.05); "
                       f"saved activations {results['memory']['activation_ratio']:.3f}x")
    print("SUMMARY: " + "; ".join(summary))


if __name__ == "__main__":
    main()
