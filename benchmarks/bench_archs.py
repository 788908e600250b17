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

    python -m benchmarks archs                                # base width, fp32 + bf16, this CPU
    python -m benchmarks archs --width big --archs transformer_sf,prime
    python -m benchmarks archs --device cuda --precisions fp16,bf16 --max-tokens 4096
    python -m benchmarks archs --quick                        # tiny widths: a smoke run
    python -m benchmarks archs --device cuda --compile --archs umst   # compiled layers (compile time apart)
"""
import argparse
import statistics
import time

import torch

from benchmarks import common, harness
from umst_dev import dev
from umst_dev import op_counts  # noqa: F401  (registers the FLOP formulas torch lacks: addbmm)

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def step_fn(model, sample, autocast_dtype, device_type):
    net_input = dev.model_inputs(model, sample)

    def step():
        model.zero_grad(set_to_none=True)
        harness.loss_fn(model, sample, net_input, autocast_dtype, device_type).backward()
    return step


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
        loss = harness.loss_fn(model, sample, net_input, autocast_dtype, device_type)
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
            loss = harness.loss_fn(model, sample, net_input, autocast_dtype, device_type)
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


def measure(names, width, precisions, device, max_tokens, repeats, warmup, quick, log=print, memory=True,
            profile=False, compile=False, lengths=harness.LENGTHS):
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    src_lengths, tgt_lengths = harness.lengths_batch(max_tokens, lengths=lengths)
    log(f"batch: {len(src_lengths)} sentences, source {min(src_lengths)}-{max(src_lengths)}, "
        f"target {min(tgt_lengths)}-{max(tgt_lengths)} tokens (with </s>), {sum(tgt_lengths)} target tokens")
    rows, steps = {}, {}
    for name in names:
        arch, model, task = harness.build(name, width, quick)
        model = model.to(device).train()
        sample = dev.move_sample(harness.make_sample(task, src_lengths, tgt_lengths), device)
        row = dict(name=name, arch=arch, params=common.n_params(model))
        row["flops"] = harness.matmul_flops(model, sample, device_type)
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
    return dict(device=common.device_name(device), device_type=device_type, torch=torch.__version__,
                threads=torch.get_num_threads() if device_type == "cpu" else None, width=width,
                max_tokens=max_tokens, sentences=len(src_lengths), repeats=repeats, quick=quick,
                precisions=list(precisions), memory=memory, compiled=bool(compile), rows=[rows[n] for n in names])


def baseline_of(name):
    """The transformer a row is compared with (``BenchRow.baseline``; a transformer row with itself)."""
    if name in harness.TRANSFORMER_ROWS:
        return name
    return harness.row(name).baseline  # a transformer of a family's shape too: its shape's cost against the base


def label_of(name):
    return harness.row(name).label


def ratios(result):
    """Per row: FLOPs, saved and time ratios, and the per-FLOP ratios, against the row's baseline transformer
    (the same attention and activation dropout: :func:`baseline_of`)."""
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
        shape = rows.get(harness.row(r["name"]).shape_baseline)
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
        label = r["arch"] + label_of(r["name"]) + common.partly_eager(r)
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
    lines += common.eager_fallback_lines([(r["arch"] + label_of(r["name"]), r) for r in result["rows"]],
                                         "kernels and times")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--width", choices=["base", "big"], default="base")
    rows = harness.table()
    p.add_argument("--archs", default=",".join(rows),
                   help="comma-separated rows (their baseline transformers are always added); choices: "
                   + ", ".join(rows))
    p.add_argument("--precisions", default=None,
                   help="comma-separated of fp32, bf16, fp16 (default: fp32,bf16 on CPU, fp16,bf16 on CUDA)")
    p.add_argument("--max-tokens", type=int, default=None, help="batch size in tokens (default 1024 CPU, 4096 CUDA)")
    p.add_argument("--lengths", default=harness.LENGTHS,
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
    unknown = [n for n in asked if n not in rows]
    shapes = harness.shape_baselines(rows)
    baselines = {baseline_of(n) for n in asked if n in rows} | {shapes[n] for n in asked if n in shapes}
    names = sorted(baselines) + [n for n in asked if n in rows and n not in baselines]
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
        src_lengths, tgt_lengths = harness.lengths_batch(max_tokens, lengths=args.lengths)
        for name in names:
            arch, model, task = harness.build(name, args.width, args.quick)
            model = model.to(args.device).train()
            sample = dev.move_sample(harness.make_sample(task, src_lengths, tgt_lengths), args.device)
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
