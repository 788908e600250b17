"""TranSFormer (transformer_sf) vs its slow-only baseline: parameters, FLOPs, train-step time, peak memory.

Slow-only baseline = fairseq ``transformer_wmt_en_de`` / ``transformer_vaswani_wmt_en_de_big`` with the
same pre-norm setting, built in the same run from the same 40K shared dictionary.

    python benchmarks/bench_transformer_sf.py                 # everything, CPU-friendly sizes
    python benchmarks/bench_transformer_sf.py --only params flops
    python benchmarks/bench_transformer_sf.py --time-batch 16 --src-len 25 --repeats 5

Paper figures: params 66M vs 63M (table 1), table 4a widths 16..256 -> 66.6/66.9/67.6/69.7/76.1M vs 63.1M;
FLOPs 1.1G -> 1.4G (base), 3.9G -> 5.0G (big) (table 8, sentence length not stated); +15% training cost.
"""
import argparse
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import umst_plugin  # noqa: E402,F401
from fairseq import options  # noqa: E402
from fairseq.data import Dictionary  # noqa: E402
from fairseq.tasks.translation import TranslationTask  # noqa: E402

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
    for key, value in {**PRE_NORM, **(overrides or {})}.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, str(value)]
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


def _train_step_time(model, d, batch, src_len, tgt_len, repeats, warmup=2):
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    src, lengths, prev, target = sample(d, batch, src_len, tgt_len)
    times = []
    for i in range(warmup + repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits, _ = model(src, lengths, prev)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), target.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_time(d, batch, src_len, tgt_len, repeats, size="base"):
    """Alternate the two models several rounds so load on the shared CPU hits both alike."""
    sf_arch, base_arch = PAIRS[size]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    models = {"transformer_sf": build(sf_arch, d).to(device), "slow_only": build(base_arch, d).to(device)}
    d_dev = d
    samples = {name: [] for name in models}
    for _ in range(3):
        for name, model in models.items():
            samples[name].append(_train_step_time(model, d_dev, batch, src_len, tgt_len, repeats))
    sf, base = min(samples["transformer_sf"]), min(samples["slow_only"])
    src, *_ = sample(d, batch, src_len, tgt_len)
    return {"device": device, "batch": batch, "src_len": src_len, "tgt_len": tgt_len,
            "char_len": char_length(models["transformer_sf"], src),
            "transformer_sf_s": sf, "slow_only_s": base, "ratio": sf / base, "paper_ratio": 1.15}


def _peak_memory_child(arch, batch, src_len, tgt_len):
    d = synthetic_dictionary()
    model = build(arch, d)
    src, lengths, prev, target = sample(d, batch, src_len, tgt_len)
    model.train()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    logits, _ = model(src, lengths, prev)
    torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), target.view(-1)).backward()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_rss_mb": after / 1024, "step_rss_increase_mb": (after - before) / 1024}))


def bench_memory(batch, src_len, tgt_len, size="base"):
    """CPU: peak RSS of one forward+backward in a fresh process (ru_maxrss), model included."""
    out = {}
    for name, arch in zip(("transformer_sf", "slow_only"), PAIRS[size]):
        proc = subprocess.run([sys.executable, __file__, "--memory-child", arch, str(batch), str(src_len),
                               str(tgt_len)], capture_output=True, text=True, check=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["ratio_step_increase"] = out["transformer_sf"]["step_rss_increase_mb"] / out["slow_only"]["step_rss_increase_mb"]
    out.update(batch=batch, src_len=src_len, tgt_len=tgt_len)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=["params", "flops", "time", "memory"])
    parser.add_argument("--src-len", type=int, default=25, help="source/target subwords per sentence")
    parser.add_argument("--time-batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_child:
        arch, batch, src_len, tgt_len = args.memory_child
        _peak_memory_child(arch, int(batch), int(src_len), int(tgt_len))
        return
    d = synthetic_dictionary()
    results = {}
    if "params" in args.only:
        results["params"] = bench_params(d)
        print(json.dumps({"params": results["params"]}, indent=1), flush=True)
    if "flops" in args.only:
        results["flops"] = bench_flops(d, args.src_len, args.src_len)
        print(json.dumps({"flops": results["flops"]}, indent=1), flush=True)
    if "time" in args.only:
        results["time"] = bench_time(d, args.time_batch, args.src_len, args.src_len, args.repeats)
        print(json.dumps({"time": results["time"]}, indent=1), flush=True)
    if "memory" in args.only:
        results["memory"] = bench_memory(args.time_batch, args.src_len, args.src_len)
        print(json.dumps({"memory": results["memory"]}, indent=1), flush=True)


if __name__ == "__main__":
    main()
