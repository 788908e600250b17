"""What one training step of every architecture costs against fairseq's pre-norm transformer, in one run.

Per architecture, on one full batch drawn from Multi30k's sentence lengths (``multi30k_lengths.json``:
test_2016_flickr, tokens per sentence; ``--lengths wmt14``: WMT14 En-De's after BPE), chosen the way fairseq
batches (a pool of sentences for 9 batches sorted by length, packed up to ``--max-tokens``, the middle batch, the
source left-padded: :func:`lengths_batch`), with a shared 10,000-entry vocabulary and each arch's paper defaults
(dropout on, train mode):

* ``flops``: matmul FLOPs of forward + backward (``torch.utils.flop_counter.FlopCounterMode``: mm, bmm,
  addmm, convolution, scaled_dot_product_attention, counted by their shapes);
* ``saved``: bytes of the tensors autograd keeps for backward, parameters excluded, each storage once
  (``torch.autograd.graph.saved_tensors_hooks``; ``ctx.save_for_backward`` of custom functions included);
* ``peak``: peak bytes allocated during the step (CUDA: ``max_memory_allocated``; CPU: the profiler's
  allocation records, ``common.peak_memory``);
* ``time``: median seconds of the step (forward, label-smoothed loss, backward) per precision: fp32, and
  ``bf16`` / ``fp16`` autocast; on CUDA timed with CUDA events, on CPU with this process's CPU time; the
  candidates are interleaved round by round so load hits them alike;
* ``tok/s``: target tokens per second;
* with ``--compile``: every row's encoder and decoder layers compiled (``umst_plugin.compilation.compile_layers``, what
  fairseq-train ``--compile`` does) after the model is built and moved to its device; ``compile_s``: the seconds
  of compiling (dynamo's and inductor's timers) during the row's first step of each precision, which is left out
  of ``time`` (the timed steps run what was compiled). ``flops`` and ``saved`` are then measured before compiling
  (the eager model: the same math, and autograd's saved tensors of the eager layers); ``peak`` and ``time`` are
  the compiled step's.

Ratios are per FLOP against the transformer of the same run: ``saved/FLOP = (saved / flops) / (saved_tf /
flops_tf)`` and ``time/FLOP`` likewise: an arch that does 1.3x the work may take 1.3x the memory and time.
Extra rows: ``transformer_sf_recompute`` (TranSFormer with ``--sf-recompute-fast``, the memory/time
trade-off: the character branch's attention and fusion sub-layers recomputed in backward) and ``transformer_prime_shape`` (a transformer of Prime's 12+12 narrow shape: Prime's rows are also
compared with it, ``vs_shape`` in the JSON, ``compare_runs.py shape``).

Usage::

    python benchmarks/bench_archs.py                                # base width, fp32 + bf16, this CPU
    python benchmarks/bench_archs.py --width big --archs transformer_sf,prime
    python benchmarks/bench_archs.py --device cuda --precisions fp16,bf16 --max-tokens 4096
    python benchmarks/bench_archs.py --quick                        # tiny widths: a smoke run
    python benchmarks/bench_archs.py --device cuda --compile --archs umst   # compiled layers (compile time apart)
"""
import argparse
import json
import os
import platform
import random
import statistics
import time

import torch
import torch.nn.functional as F

try:  # imported from the installed benchmarks package (tests), or run as a script (its folder on sys.path)
    from benchmarks import common
except ImportError:
    import common

from umst_dev import dev
from umst_dev import op_counts  # noqa: F401  (registers the FLOP formulas torch lacks: addbmm)

HERE = os.path.dirname(os.path.abspath(__file__))
LENGTHS = os.path.join(HERE, "multi30k_lengths.json")
VOCAB = 10000
PRENORM = dict(encoder_normalize_before=True, decoder_normalize_before=True)

# name -> (arch at base width, arch at big width, overrides). The transformer rows are the baselines: each arch
# is compared with the pre-norm transformer at the same attention and activation dropout (its paper's): a
# dropout on the attention weights has no fused kernel on a CPU, so there torch keeps the weights for backward
# and runs the math in fp32 (also in fairseq's MultiheadAttention of every decoder); comparing with a transformer
# without it would charge that CPU artefact to the arch (on a GPU the fused kernels take the dropout).
DROPOUT_01 = dict(attention_dropout=0.1, activation_dropout=0.1)
ARCHS = {
    "transformer": ("transformer", "transformer_vaswani_wmt_en_de_big", PRENORM),
    "transformer_dropout": ("transformer", "transformer_vaswani_wmt_en_de_big", dict(PRENORM, **DROPOUT_01)),
    "umst": ("umst_base", "umst_big", {}),
    "umst_rpr": ("umst_base_rpr", "umst_big_rpr", {}),
    "transformer_sf": ("transformer_sf_base", "transformer_sf_big", {}),
    # the trade-off flag: the character branch's sub-layers recomputed in backward rather than kept
    "transformer_sf_recompute": ("transformer_sf_base", "transformer_sf_big", {"sf_recompute_fast": True}),
    "msc": ("msc_base", "msc_big", {}),
    "msmsa": ("msmsa_base", "msmsa_big", {}),
    "prime": ("prime_base", "prime_big", {}),
    "prime_simple": ("prime_simple_base", "prime_simple_big", {}),
    # Prime's shape (12+12 layers, narrower and deeper than the transformer's 6+6): activations grow with
    # layers x width and matmul FLOPs with layers x width^2, so a narrower model keeps more bytes per FLOP
    # whatever its layers are. This transformer tells the shape's share of Prime's ratio from the layers'.
    "transformer_prime_shape": ("transformer", "transformer_vaswani_wmt_en_de_big",
                                dict(PRENORM, encoder_layers=12, decoder_layers=12, encoder_embed_dim=384,
                                     decoder_embed_dim=384, encoder_ffn_embed_dim=768, decoder_ffn_embed_dim=768,
                                     encoder_attention_heads=4, decoder_attention_heads=4, dropout=0.4),
                                dict(encoder_embed_dim=768, decoder_embed_dim=768, encoder_ffn_embed_dim=3072,
                                     decoder_ffn_embed_dim=3072, encoder_attention_heads=16,
                                     decoder_attention_heads=16, dropout=0.3)),
}
# the others: "transformer" (attention and activation dropout 0)
BASELINE = {name: "transformer_dropout" for name in ("umst", "umst_rpr", "transformer_sf", "transformer_sf_recompute",
                                                     "msc")}
LABELS = {"transformer_dropout": " (dropout 0.1)", "transformer_prime_shape": " (Prime's shape)",
          "transformer_sf_recompute": " --sf-recompute-fast"}
SHAPE_BASELINE = {"prime": "transformer_prime_shape", "prime_simple": "transformer_prime_shape"}
QUICK = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=32, decoder_embed_dim=32,
             encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64, encoder_attention_heads=4,
             decoder_attention_heads=4)
QUICK_EXTRA = {"transformer_sf": dict(fast_embed_dim=8, fast_ffn_embed_dim=16, fast_attention_heads=2),
               "transformer_sf_recompute": dict(fast_embed_dim=8, fast_ffn_embed_dim=16, fast_attention_heads=2),
               "msc": dict(encoder_blocks=2, encoder_layers_per_block=1)}
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
POOL_BATCHES = 9  # lengths_batch draws sentences for at least this many batches and takes the middle one


def lengths_batch(max_tokens, seed=0, lengths=LENGTHS):
    """(source lengths, target lengths) of one full batch as fairseq builds it, drawn from a length distribution
    (``lengths``: a JSON file's pairs, by default Multi30k's, or ``"wmt14"``, ``synthetic_corpus.WMT14``).

    A pool of sentences large enough for at least :data:`POOL_BATCHES` batches is drawn (the file's pairs in seeded
    random orders, as ``synthetic_corpus.py`` draws a split), sorted by (source, target) length and packed while
    bsz x max(len) <= max_tokens (lengths + 1 for </s>), as fairseq's ``batch_by_size`` packs; the batch in the
    middle of that list is taken: sentences of the median length, and a full batch (within one sentence's length
    of the budget), never the short remainder at a list's end."""
    from benchmarks import synthetic_corpus

    rng = random.Random(f"lengths-batch-{seed}")
    probe = synthetic_corpus.draw_lengths(rng, lengths, 200)
    mean = sum(max(s, t) + 1 for s, t in probe) / len(probe)
    pool = probe + synthetic_corpus.draw_lengths(rng, lengths, int(POOL_BATCHES * max_tokens / mean) + 1)
    pairs = sorted((s + 1, t + 1) for s, t in pool)
    batches, current, longest = [], [], 0
    for s, t in pairs:
        longest_next = max(longest, s, t)
        if current and longest_next * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest_next = [], max(s, t)
        current.append((s, t))
        longest = longest_next
    if current:
        batches.append(current)
    batch = batches[len(batches) // 2]
    return [s for s, _ in batch], [t for _, t in batch]


def make_sample(task, src_lengths, tgt_lengths, seed=0):
    """A collated batch with exactly these lengths (random tokens and dependency trees)."""
    data = dev.dataset_of_lengths(task, src_lengths, tgt_lengths, seed=seed)
    return dev.collate(data, range(len(src_lengths)))


def build(name, width, quick):
    base, big, overrides, *big_overrides = ARCHS[name]
    arch = big if width == "big" else base
    overrides = dict(overrides, share_all_embeddings=True)
    if width == "big" and big_overrides:
        overrides.update(big_overrides[0])
    if quick:
        overrides.update(QUICK)
        overrides.update(QUICK_EXTRA.get(name, {}))
    model, task = dev.build_model(arch, overrides, dictionary=dev.make_dictionary(VOCAB))
    return arch, model, task


def loss_fn(model, sample, net_input, autocast_dtype, device_type):
    pad = model.decoder.dictionary.pad()
    with torch.autocast(device_type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        logits = model(**net_input)[0]
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), sample["target"].view(-1),
                           ignore_index=pad, label_smoothing=0.1)


def step_fn(model, sample, autocast_dtype, device_type):
    net_input = dev.model_inputs(model, sample)

    def step():
        model.zero_grad(set_to_none=True)
        loss_fn(model, sample, net_input, autocast_dtype, device_type).backward()
    return step


def matmul_flops(model, sample, device_type):
    from torch.utils.flop_counter import FlopCounterMode

    net_input = dev.model_inputs(model, sample)
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter:
        loss_fn(model, sample, net_input, None, device_type).backward()
    return counter.get_total_flops()


def saved_bytes(model, sample, autocast_dtype, device_type):
    """Bytes autograd saves for backward in one step, parameters excluded, each storage counted once."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in params and ptr not in seen:
            seen[ptr] = storage.nbytes()
        return t

    net_input = dev.model_inputs(model, sample)
    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model, sample, net_input, autocast_dtype, device_type)
    loss.backward()
    return sum(seen.values())


def saved_bytes_by_module(model, sample, autocast_dtype, device_type, depth=6):
    """Bytes autograd saves for backward, parameters excluded, by the innermost module (first ``depth`` levels of
    its name) that was running when each tensor was saved; each storage counted once, for its first saver."""
    import collections

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, stack, by_module = set(), ["<model>"], collections.Counter()
    hooks = []
    def leave(module, args, output):
        stack.pop()  # (returns None: a forward hook's return value would replace the output)

    for name, module in model.named_modules():
        short = ".".join(name.split(".")[:depth]) or "<model>"
        hooks.append(module.register_forward_pre_hook(lambda m, a, short=short: stack.append(short)))
        hooks.append(module.register_forward_hook(leave))

    def pack(t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in params and ptr not in seen:
            seen.add(ptr)
            by_module[stack[-1]] += storage.nbytes()
        return t

    net_input = dev.model_inputs(model, sample)
    model.zero_grad(set_to_none=True)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = loss_fn(model, sample, net_input, autocast_dtype, device_type)
    finally:
        for h in hooks:
            h.remove()
    loss.backward()
    return by_module


def event_time(fn, device):
    """Seconds of one call: CUDA events on a GPU, process CPU time on a CPU."""
    if str(device).startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    return common.timed(fn, device, cpu_time=True)[1]


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        family = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("cpu family"))
        number = next(line.split(":", 1)[1].strip() for line in info.splitlines()
                      if line.startswith("model") and not line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags"))
        isa = "AVX-512" if "avx512f" in flags else "AVX2"
        extra = ", avx512_bf16" if "avx512_bf16" in flags else ""
        return f"{model} (family {family}, model {number}), {isa}{extra}, {os.cpu_count()} cores"
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def device_name(device):
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(device)
    return cpu_name()


def measure(names, width, precisions, device, max_tokens, repeats, warmup, quick, log=print, memory=True,
            profile=False, compile=False, lengths=LENGTHS):
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    src_lengths, tgt_lengths = lengths_batch(max_tokens, lengths=lengths)
    log(f"batch: {len(src_lengths)} sentences, source {min(src_lengths)}-{max(src_lengths)}, "
        f"target {min(tgt_lengths)}-{max(tgt_lengths)} tokens (with </s>), {sum(tgt_lengths)} target tokens")
    rows, steps = {}, {}
    for name in names:
        arch, model, task = build(name, width, quick)
        model = model.to(device).train()
        sample = dev.move_sample(make_sample(task, src_lengths, tgt_lengths), device)
        row = dict(name=name, arch=arch, params=common.n_params(model))
        row["flops"] = matmul_flops(model, sample, device_type)
        if memory:
            row["saved"] = {p: saved_bytes(model, sample, PRECISIONS[p], device_type) for p in precisions}
            row["peak"] = {}
        if compile:  # after FLOPs and saved bytes (eager), before the steps
            from umst_dev.compiled_layers import fallback_record
            from umst_plugin import compilation

            compilation.compile_layers(model, device=device)
            row["compile_s"] = {}
        for p in precisions:
            step = step_fn(model, sample, PRECISIONS[p], device_type)
            if compile:
                before = compilation.compile_seconds()
            step()  # allocator warm, lazy state built (with --compile: compiled)
            if compile:
                row["compile_s"][p] = round(compilation.compile_seconds() - before, 2)
            if memory:
                row["peak"][p] = common.peak_memory(step, device)
            steps[(name, p)] = step
        row["target_tokens"] = int(sample["ntokens"])
        if compile:  # layer variants whose compile failed run eager (umst_plugin.compilation.fallback): say which
            row.update(fallback_record(model))
        rows[name] = row
        log(f"  {name} ({arch}): {row['params'] / 1e6:.1f}M parameters, {row['flops'] / 1e9:.1f} GFLOP"
            + "".join(f", saved {p} {row['saved'][p] / 2**20:.0f} MiB" for p in precisions if memory)
            + "".join(f", compiled {p} in {row['compile_s'][p]:.1f} s" for p in precisions if compile)
            + common.fell_back(row))
        rows[name]["_model"] = model
    for p in precisions:
        fns = {name: steps[(name, p)] for name in names}
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        times = {name: [] for name in names}
        for _ in range(repeats):
            for name, fn in fns.items():
                times[name].append(event_time(fn, device))
        for name in names:
            rows[name].setdefault("time", {})[p] = statistics.median(times[name])
            rows[name].setdefault("tokens_per_s", {})[p] = rows[name]["target_tokens"] / rows[name]["time"][p]
        if profile and device_type == "cuda":  # kernels per step and GPU busy (benchmarks/common.cuda_profile)
            for name, fn in fns.items():
                rows[name].setdefault("profile", {})[p] = common.cuda_profile(fn)
    for name in names:
        rows[name].pop("_model")
    return dict(device=device_name(device), device_type=device_type, torch=torch.__version__,
                threads=torch.get_num_threads() if device_type == "cpu" else None, width=width,
                max_tokens=max_tokens, sentences=len(src_lengths), repeats=repeats, quick=quick,
                precisions=list(precisions), memory=memory, compiled=bool(compile), rows=[rows[n] for n in names])


def baseline_of(name):
    if name in ("transformer", "transformer_dropout"):
        return name
    return BASELINE.get(name, "transformer")  # transformer_prime_shape too: its shape's cost against the base


def ratios(result):
    """Per row: FLOPs, saved and time ratios, and the per-FLOP ratios, against the row's baseline transformer
    (the same attention and activation dropout: ``BASELINE``)."""
    rows = {r["name"]: r for r in result["rows"]}
    out = []
    for r in result["rows"]:
        base = baseline_of(r["name"])
        tf = rows[base]
        flops = r["flops"] / tf["flops"]
        entry = dict(name=r["name"], arch=r["arch"], baseline=base, flops=flops)
        for p in result["precisions"]:
            t = r["time"][p] / tf["time"][p]
            entry[p] = dict(time=t, time_per_flop=t / flops)
            if "saved" in r:
                saved = r["saved"][p] / tf["saved"][p]
                entry[p].update(saved=saved, saved_per_flop=saved / flops, peak=r["peak"][p] / tf["peak"][p])
            if "profile" in r and p in r["profile"]:
                mine, theirs = r["profile"][p], tf["profile"][p]
                entry[p].update(kernels_per_flop=mine["kernels"] / theirs["kernels"] / flops, busy=mine["busy"])
        shape = rows.get(SHAPE_BASELINE.get(r["name"]))
        if shape is not None:  # also against the transformer of the arch's own shape
            entry["shape_baseline"] = shape["name"]
            for p in result["precisions"]:
                shape_flops = r["flops"] / shape["flops"]
                entry[p]["vs_shape"] = dict(flops=shape_flops,
                                            time_per_flop=r["time"][p] / shape["time"][p] / shape_flops)
                if "saved" in r:
                    entry[p]["vs_shape"]["saved_per_flop"] = r["saved"][p] / shape["saved"][p] / shape_flops
        out.append(entry)
    return out


def markdown(result):
    """The table: one row per arch; per precision saved MiB, peak MiB (when measured), ms, tokens/s and the
    per-FLOP ratios; kernels per step and GPU busy when profiled."""
    precisions = result["precisions"]
    memory = result.get("memory", True)
    profiled = any("profile" in r for r in result["rows"])
    compiled = any("compile_s" in r for r in result["rows"])
    head = ["arch", "baseline", "params", "GFLOP", "FLOPs"]
    for p in precisions:
        if memory:
            head += [f"saved {p} MiB", f"saved/FLOP {p}", f"peak {p} MiB"]
        if compiled:
            head += [f"compile {p} s"]
        head += [f"{p} ms", f"tok/s {p}", f"time/FLOP {p}"]
        if profiled:
            head += [f"kernels {p}", f"kernels/FLOP {p}", f"GPU busy {p}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    by_name = {r["name"]: r for r in result["rows"]}
    for ratio in result.get("ratios") or ratios(result):  # as recorded: older runs had one baseline
        r = by_name[ratio["name"]]
        label = r["arch"] + LABELS.get(r["name"], "") + common.partly_eager(r)
        cells = [label, ratio.get("baseline", "transformer").replace("transformer_dropout", "tf dropout 0.1").replace(
            "transformer", "tf"), f"{r['params'] / 1e6:.1f}M", f"{r['flops'] / 1e9:.1f}", f"{ratio['flops']:.2f}x"]
        for p in precisions:
            if memory:
                cells += [f"{r['saved'][p] / 2**20:.0f}", f"{ratio[p]['saved_per_flop']:.2f}",
                          f"{r['peak'][p] / 2**20:.0f}"]
            if compiled:
                cells += [f"{r['compile_s'][p]:.1f}" if "compile_s" in r else "-"]
            cells += [f"{r['time'][p] * 1000:.1f}", f"{r['tokens_per_s'][p]:.0f}", f"{ratio[p]['time_per_flop']:.2f}"]
            if profiled:
                prof = r.get("profile", {}).get(p)
                cells += [f"{prof['kernels']:,}", f"{ratio[p]['kernels_per_flop']:.2f}", f"{prof['busy']:.2f}"] \
                    if prof else ["-"] * 3
        lines.append("| " + " | ".join(cells) + " |")
    lines += common.eager_fallback_lines([(r["arch"] + LABELS.get(r["name"], ""), r) for r in result["rows"]],
                                         "kernels and times")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--width", choices=["base", "big"], default="base")
    p.add_argument("--archs", default=",".join(ARCHS),
                   help="comma-separated rows (their baseline transformers are always added); choices: "
                   + ", ".join(ARCHS))
    p.add_argument("--precisions", default=None,
                   help="comma-separated of fp32, bf16, fp16 (default: fp32,bf16 on CPU, fp16,bf16 on CUDA)")
    p.add_argument("--max-tokens", type=int, default=None, help="batch size in tokens (default 1024 CPU, 4096 CUDA)")
    p.add_argument("--lengths", default=LENGTHS,
                   help="the length distribution the batch is drawn from: a JSON file of (source, target) pairs "
                        "(default: Multi30k's test set) or 'wmt14' (WMT14 En-De's BPE lengths, synthetic_corpus.py)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--quick", action="store_true", help="tiny widths, one repeat: a smoke run")
    p.add_argument("--json", default=None, help="write the measurements (and ratios) here")
    p.add_argument("--markdown", default=None, help="write the table here")
    p.add_argument("--dry-run", action="store_true", help="check the arguments and the arch names, measure nothing")
    p.add_argument("--profile", action="store_true",
                   help="on CUDA: also profile one step per arch and precision (kernels launched, GPU busy)")
    p.add_argument("--no-memory", action="store_true", help="skip the saved-bytes and peak-memory passes")
    p.add_argument("--compile", action="store_true",
                   help="compile every row's encoder and decoder layers as fairseq-train --compile does; the compile "
                        "time is reported apart (compile_s) and left out of the step times")
    p.add_argument("--by-module", action="store_true",
                   help="only print, per arch, the saved activation bytes by module (where the memory goes)")
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    precisions = (args.precisions or ("fp16,bf16" if cuda else "fp32,bf16")).split(",")
    bad = [x for x in precisions if x not in PRECISIONS]
    asked = [n for n in args.archs.split(",") if n]
    unknown = [n for n in asked if n not in ARCHS]
    baselines = {baseline_of(n) for n in asked if n in ARCHS} | {SHAPE_BASELINE[n] for n in asked
                                                                 if n in SHAPE_BASELINE}
    names = sorted(baselines) + [n for n in asked if n in ARCHS and n not in baselines]
    if bad or unknown:
        p.error(f"unknown precision(s) {bad} or arch(s) {unknown}")
    max_tokens = args.max_tokens or (4096 if cuda else 1024)
    if args.dry_run:
        print(f"bench_archs: would measure {names} at {args.width} width, {precisions}, {max_tokens} tokens "
              f"on {args.device}{' with --compile' if args.compile else ''}")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.by_module:
        src_lengths, tgt_lengths = lengths_batch(max_tokens, lengths=args.lengths)
        for name in names:
            arch, model, task = build(name, args.width, args.quick)
            model = model.to(args.device).train()
            sample = dev.move_sample(make_sample(task, src_lengths, tgt_lengths), args.device)
            device_type = "cuda" if cuda else "cpu"
            counts = saved_bytes_by_module(model, sample, PRECISIONS[precisions[0]], device_type)
            total = sum(counts.values())
            print(f"\n{arch} ({precisions[0]}): {total / 2**20:.0f} MiB saved")
            for module, n in counts.most_common(25):
                print(f"  {n / 2**20:8.1f} MiB  {100 * n / total:5.1f}%  {module}")
        return 0
    start = time.time()
    result = measure(names, args.width, precisions, args.device, max_tokens, 1 if args.quick else args.repeats,
                     0 if args.quick else args.warmup, args.quick, memory=not args.no_memory, profile=args.profile,
                     compile=args.compile, lengths=args.lengths)
    result["ratios"] = ratios(result)
    result["seconds"] = round(time.time() - start, 1)
    table = markdown(result)
    print(f"\n{result['device']}, torch {result['torch']}, {args.width} width, {result['sentences']} sentences "
          f"({max_tokens} max tokens){', layers compiled' if args.compile else ''}\n\n{table}")
    common.write_results(result, table, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
