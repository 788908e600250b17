"""Kernel launches of one whole fairseq update, per architecture and phase, against stock fairseq's transformer.

On a GPU at base width a training step waits on the host: on an H200 a bf16 step of 4,096 tokens kept the GPU
busy 0.11-0.22 of the time (docs/performance.md), so what an update costs there is much more its number of kernel
launches than its FLOPs. This benchmark counts them without a GPU: ``umst_dev.op_counts.KernelLaunches``
sees every aten op below autograd (views, bare allocations and metadata left out; a multi-tensor op as the
launches CUDA's multi-tensor apply makes), on the CPU as on a GPU. Where both run the same ops the count is the
GPU's (the transformer's eager bf16 update: 1,434 here, 1,505 CUDA kernels on the H200); where a GPU fuses what a
CPU does not (attention with dropout) the GPU launches fewer.

One update is what ``fairseq-train`` runs per batch: fairseq's own ``Trainer.train_step`` on a batch of 32
random sentences of up to 25 tokens (a 10,000-entry shared vocabulary; the same sentences for every arch), with
``--optimizer adam --clip-norm 0.1 --criterion label_smoothed_cross_entropy``, after one warm-up update (the
optimizer's state is built). Phases:

* ``forward``: the model and the loss (``criterion.forward``);
* ``backward``: ``optimizer.backward(loss)``;
* ``amp``: the grad scaler (unscale, the non-finite check, its update), under ``--amp``;
* ``grad norm``: the gradient norm and clipping (``optimizer.clip_grad_norm``, the unscale excluded);
* ``optimizer``: the torch optimizer's ``step``;
* ``zero grad``: ``optimizer.zero_grad``;
* ``rest``: everything else the trainer does (gradient scaling by the sample size, learning rate, logging).

``stock`` is fairseq's own transformer (pre-norm), its ``translation`` task and adam, in a process that never
imports the plugin (``--stock``): what a user gets without ``--user-dir``. The plugin's rows run with the plugin
loaded, its fast paths on (``--use-old-adam`` gives fairseq's adam back: the ``transformer --use-old-adam`` row).
Ratios are per matmul FLOP (``torch.utils.flop_counter``, forward + backward) against ``stock``.

``--compile``: each plugin row also compiles its layers as fairseq-train ``--compile`` does
(``umst_plugin.compilation.compile_layers``), runs two updates that compile them, and counts one compiled update.
Compiled code refuses to run under a dispatch mode, so its forward and backward are counted from the profiler
(``op_counts.profiled_launches``: the same ops, within 2% of the dispatch count on an eager update, plus every
kernel inductor generated; on a CPU inductor compiles C++ and marks each kernel for the profiler); the other
phases stay eager and keep the dispatch count. The row's ``launches`` is then the compiled update's;
``eager_launches`` the same model's eager one. On a CPU the compiled kernels are C++ loops, not Triton kernels:
inductor fuses on both from the same graph, but where it splits a fusion group differs, so this count estimates
a GPU's compiled kernel count less closely than the eager count does (``--device cuda --compile`` profiles the
real one). The stock row stays eager: what a user gets without the plugin.

    python -m benchmarks launches                       # every arch, fp32, this CPU
    python -m benchmarks launches --archs umst,prime --precision bf16 --json out.json
    python -m benchmarks launches --quick               # tiny widths: a smoke run
    python -m benchmarks launches --compile --archs transformer,umst   # compiled layers (minutes per arch)
    python -m benchmarks launches --compile --floor --archs prime      # and a transformer of Prime's shape
    python -m benchmarks launches --compile --simulate-gpu h200 --precision bf16 --archs transformer
    python -m benchmarks launches --compile --simulate-gpu h200 --precision bf16 --archs transformer,prime \
        --floor --max-tokens 4096 --lengths wmt14           # bytes and kernels per FLOP at a WMT batch

``--simulate-gpu h200`` (with ``--compile``, on a CPU, under a CUDA build of torch with Triton: the GPU machines'
torch runs on a CPU): the compiled layers' forward and backward are counted as inductor's GPU program, Triton
kernels and library calls, generated on this CPU for a simulated H200 and not run
(``umst_dev/simulated_gpu.py``); the graphs run eagerly for the numbers. Fused attention counts as the GPU's one
kernel each way. The eager rows and phases stay this CPU's count. It also measures what those programs move: bytes
(each Triton kernel by inductor's estimate, each library call by its input views and outputs) and FLOPs (the products'
and attentions') of the compiled layers in the counted update, forward and backward apart, and gives their bytes and
kernels per FLOP against the plugin transformer's of the same run (and with ``--floor`` against the row's own shape's):
the second table (docs/compile.md, "Memory traffic per FLOP, counted on a CPU").

``--max-tokens N --lengths wmt14``: one full batch of N tokens drawn from a length distribution
(``bench_archs.lengths_batch``) instead of 32 sentences of up to 25 tokens, the same in every row (the stock row's
process too). ``--dump-gpu-code DIR`` keeps each simulated program (inductor's wrapper, its Triton kernels inside).

``--floor``: Prime's 12+12 layers at d 384 launch more per FLOP than the 6+6 transformer at d 512 whatever their
layers do; the ``transformer_prime_shape`` row (fairseq's post-norm transformer at prime_base's sizes) is what
that shape alone costs, and ``fwd+bwd per FLOP vs own shape`` each Prime row's forward + backward per FLOP against it.
TranSFormer's two branches (6 blocks at d 512 and 6 at d 32 over the characters, a cross-attention each way per
block) likewise: ``transformer_sf_shape`` is ``transformer_sf_base`` with an encoder stack of fairseq's own
transformer layers in that shape (``benchmarks/paper/transformer_sf.py``).
"""
import argparse
import contextlib
import functools
import json
import os
import random
import subprocess
import sys
import time

import torch

from benchmarks import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VOCAB = 10000
SENTENCES, MAX_LEN = 32, 25
PHASES = ("forward", "backward", "amp", "grad norm", "optimizer", "zero grad", "rest")
FWD_BWD = ("forward", "backward")
COMPILE_WARMUP = 2  # --compile: updates that compile the layers (training variants) before the counted one
COMPILE_BACKEND = "inductor"  # --compile's backend, fairseq-train --compile's
DUMP_GPU_CODE = None  # --dump-gpu-code: a folder for the simulated GPU programs' wrappers
# this benchmark's rows beyond the arch table's: the transformer with fairseq's adam; "stock" (fairseq's own
# transformer, its task and adam) runs in a process of its own
PRENORM = harness.PRENORM  # the transformer's rows, the stock one's too
OWN_ROWS = {"transformer_old_adam": ("transformer", dict(PRENORM, use_old_adam=True))}
LABELS = {"transformer": "transformer (plugin loaded)", "transformer_old_adam": "transformer --use-old-adam",
          "stock": "stock fairseq transformer"}
# The floor of a family's shape (``BenchRow.shape_baseline``) is counted here as fairseq's post-norm transformer at
# the family's sizes and the arch's default dropout, as this benchmark has always counted it (its launch targets
# were set against that count); bench_archs measures the registry's pre-norm one at the paper's dropout. Launches
# do not depend on the dropout rate; post-norm moves one LayerNorm per sub-layer.
NOT_IN_FLOOR = ("encoder_normalize_before", "decoder_normalize_before", "dropout")


@functools.lru_cache(maxsize=None)
def launch_rows():
    """name -> dict(arch, overrides, quick: a smoke run's sizes on top of harness.QUICK, label, floor_of: the rows
    it is the floor of, register: what registers its model first): the transformer's rows, every family's
    measured rows, the floors of their shapes (the registry's transformers of a family's shape, and the models of
    a family's shape its paper table defines, ``benchmarks/paper``'s ``shape_rows``)."""
    from benchmarks import paper

    table = harness.table()
    rows = {"transformer": dict(arch="transformer", overrides=dict(harness.PRENORM))}
    rows.update((n, dict(arch=arch, overrides=overrides)) for n, (arch, overrides) in OWN_ROWS.items())
    measured = [n for n in harness.measured_rows(table) if n != "transformer"]
    extras = [n for n, r in table.items() if r.extra]  # asked for by name only (not in the default --archs)
    for name in measured + extras:
        row = table[name]
        rows[name] = dict(arch=row.base, overrides=dict(row.overrides), quick=dict(row.quick),
                          label=row.base + row.label, extra=row.extra)  # labelled as bench_archs labels a row
    for floor, shaped in _inverse(harness.shape_baselines(table)).items():
        overrides = {k: v for k, v in table[floor].overrides.items() if k not in NOT_IN_FLOOR}
        first = table[shaped[0]]
        rows[floor] = dict(arch=table[floor].base, overrides=overrides, floor_of=shaped,
                           label=f"transformer, {first.base}'s shape ({overrides['encoder_layers']}+"
                                 f"{overrides['decoder_layers']}, d {overrides['encoder_embed_dim']})")
    for name, shape in paper.shape_rows().items():
        rows[name] = dict(shape)
    return rows


def _inverse(mapping):
    out = {}
    for key, value in mapping.items():
        out.setdefault(value, []).append(key)
    return out


def floors():
    """row -> the floor of its shape (``--floor``)."""
    return {shaped: name for name, row in launch_rows().items() for shaped in row.get("floor_of", ())}


def label_of(name, arch):
    return LABELS.get(name) or launch_rows().get(name, {}).get("label") or arch


TRAINING = dict(optimizer="adam", adam_betas="(0.9,0.98)", lr=5e-4, lr_scheduler="inverse_sqrt", warmup_updates=100,
                clip_norm=0.1, criterion="label_smoothed_cross_entropy", label_smoothing=0.1, max_tokens=4096,
                share_all_embeddings=True, seed=1, source_lang="src", target_lang="tgt")


def make_dictionary(vocab):
    """A subword-nmt style dictionary (every third entry continues its word), as ``umst_dev.dev``'s, built
    without importing the plugin (the stock process must not load its patches)."""
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"w{i}@@" if i % 3 == 1 else f"w{i}")
    d.finalize(padding_factor=1)
    return d


def random_pairs(dictionary, n=SENTENCES, max_len=MAX_LEN, seed=0, lengths=None):
    """``n`` (source, target) token lists of 2..max_len tokens, each ending in a whole word (no </s>); with
    ``lengths`` ((source lengths, target lengths), </s> included, as ``bench_archs.lengths_batch`` gives them) one
    pair of each of those lengths instead."""
    rng = random.Random(seed)
    symbols = list(range(dictionary.nspecial, len(dictionary)))
    whole = [s for s in symbols if not dictionary[s].endswith("@@")]

    def sentence(length=None):
        pieces = [rng.choice(symbols) for _ in range(rng.randint(2, max_len) if length is None else length)]
        pieces[-1] = rng.choice(whole)
        return pieces
    if lengths is not None:
        return [(sentence(s - 1), sentence(t - 1)) for s, t in zip(*lengths)]
    return [(sentence(), sentence()) for _ in range(n)]


def language_pair_dataset(dictionary, pairs):
    from fairseq.data import LanguagePairDataset

    eos = dictionary.eos()
    src = [torch.tensor(s + [eos]) for s, _ in pairs]
    tgt = [torch.tensor(t + [eos]) for _, t in pairs]
    return LanguagePairDataset(src, torch.tensor([len(s) for s in src]), dictionary, tgt,
                               torch.tensor([len(t) for t in tgt]), dictionary, left_pad_source=True, shuffle=False)


def sample_for(task, dictionary, pairs, side_data):
    """The collated batch: the task's side data (word ids, random dependency heads) where it has them."""
    dataset = language_pair_dataset(dictionary, pairs)
    if side_data:
        from umst_plugin.data.side_data_dataset import SideDataLanguagePairDataset
        from umst_plugin.data.word_boundaries import word_ids_from_pieces

        rng = random.Random(1)
        word_ids, heads = [], []
        for source, _ in pairs:
            wids = word_ids_from_pieces([dictionary[p] for p in source])
            n_words = wids[-1]
            word_ids.append(torch.tensor(wids, dtype=torch.long))
            heads.append(torch.tensor([rng.choice([h for h in range(n_words + 1) if h != w])
                                       for w in range(1, n_words + 1)], dtype=torch.long))
        dataset = SideDataLanguagePairDataset(dataset, word_ids, heads, batch_hints=getattr(task, "batch_hints", None))
    return dataset.collater([dataset[i] for i in range(len(dataset))])


overrides_to_argv = harness.overrides_to_argv


def build_trainer(arch, overrides, precision, plugin, quick, device="cpu", lengths=None):
    """fairseq's Trainer for ``arch`` on the synthetic vocabulary, and the batch; ``plugin``: with
    ``--user-dir umst_plugin`` and its task, else fairseq's ``translation`` task alone; ``quick``: a smoke run's
    sizes (a dict of overrides, or True: ``harness.QUICK``), or None."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    overrides = dict(TRAINING, **overrides)
    if quick:  # a smoke run's sizes: a dict, or True for harness.QUICK
        overrides.update(harness.QUICK if quick is True else quick)
    if not str(device).startswith("cuda"):
        overrides["cpu"] = True
    if precision != "fp32":
        overrides["amp"] = True
        if plugin:
            overrides["amp_dtype"] = {"bf16": "bfloat16", "fp16": "float16"}[precision]
    task_name = "multiscale_translation" if plugin else "translation"
    argv = ["/nonexistent-data", "--task", task_name, "--arch", arch]
    if plugin:
        argv += ["--user-dir", os.path.join(ROOT, "umst_plugin")]
    args = options.parse_args_and_arch(options.get_training_parser(default_task=task_name),
                                       input_args=argv + overrides_to_argv(overrides))
    cfg = convert_namespace_to_omegaconf(args)
    dictionary = make_dictionary(VOCAB)
    task = tasks.TASK_REGISTRY[task_name](cfg.task, dictionary, dictionary)
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    sample = sample_for(task, dictionary, random_pairs(dictionary, lengths=lengths), side_data=plugin)
    return trainer, sample


def wrap(obj, name, counter, phase):
    """Count what ``obj.name`` runs as ``phase``, and mark it for the profiler (``common.PHASE_PREFIX``)."""
    method = getattr(obj, name)
    label = "phase:" + phase

    def wrapped(*args, **kwargs):
        with counter.in_phase(phase), torch.profiler.record_function(label):
            return method(*args, **kwargs)
    setattr(obj, name, wrapped)


def instrument(trainer, counter):
    """Attribute what runs to phases by wrapping the trainer's objects' methods (this trainer only)."""
    from fairseq.optim.amp_optimizer import AMPOptimizer

    optimizer = trainer.optimizer
    wrap(trainer.criterion, "forward", counter, "forward")
    wrap(optimizer, "backward", counter, "backward")
    wrap(optimizer, "clip_grad_norm", counter, "grad norm")
    wrap(optimizer, "zero_grad", counter, "zero grad")
    if isinstance(optimizer, AMPOptimizer):
        wrap(optimizer, "step", counter, "amp")  # the scaler's step and update around the torch optimizer's
        wrap(optimizer.scaler, "unscale_", counter, "amp")
    else:
        wrap(optimizer, "step", counter, "optimizer")
    wrap(optimizer.optimizer, "step", counter, "optimizer")  # the torch optimizer itself


def profiled_update(trainer, sample):
    """Launches of one update by phase, from the profiler (``op_counts.profiled_launches``: what the dispatch count
    sees, and inside compiled layers the generated kernels and the ops the compiled code calls)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.train_step([sample])
    by_phase, by_op = op_counts_module().profiled_launches(prof.events(), benchmark_common().PHASE_PREFIX)
    return {p: by_phase.get(p, 0) for p in PHASES}, by_op


def compile_and_count(trainer, sample, row, device):
    """``--compile``: count one eager update with the profiler, compile the layers as fairseq-train ``--compile``
    does, run the warm-up updates that compile them, then count one compiled update. The compiled row's forward
    and backward are the profiler's count of the compiled update; its other phases (eager under ``--compile`` too)
    stay the dispatch count, which sees the multi-tensor ops' tensor lists."""
    benchmark_common()  # (run as a script: puts the repository root, which holds umst_dev, on sys.path)
    from umst_dev.compiled_layers import fallback_record
    from umst_plugin import compilation

    eager, _ = profiled_update(trainer, sample)
    from umst_dev import simulated_gpu

    simulated = isinstance(COMPILE_BACKEND, simulated_gpu.Backend)  # --simulate-gpu
    if simulated:  # the compiled layers' attention as a GPU's fused kernel
        counted_as_gpu = simulated_gpu.fused_attention()
        graphs_before = len(COMPILE_BACKEND.graphs)
    else:
        counted_as_gpu = contextlib.nullcontext()
    with counted_as_gpu:
        compilation.compile_layers(trainer.model, device=device, backend=COMPILE_BACKEND)
        before = compilation.compile_seconds()
        for _ in range(COMPILE_WARMUP):
            trainer.train_step([sample])
        with COMPILE_BACKEND.count_runs() if simulated else contextlib.nullcontext():
            compiled, by_op = profiled_update(trainer, sample)
    if simulated:
        row["simulated_gpu"] = COMPILE_BACKEND.device
        row["simulated_graphs"] = [(kind, dict(counts)) for kind, counts in COMPILE_BACKEND.graphs[graphs_before:]]
        row["simulated_library_calls"] = by_op.get("simulated library calls", 0)
        # the compiled layers' memory traffic and FLOPs in the counted update, forward and backward
        row["simulated_traffic"] = COMPILE_BACKEND.traffic()
        row["simulated_programs"] = [p.record() for p in COMPILE_BACKEND.programs[graphs_before:]]
        # what would keep --compile-cudagraphs from replaying a program (none: every graph is replayed)
        row["cudagraph_blockers"] = sorted({b for p in COMPILE_BACKEND.programs[graphs_before:]
                                            for b in p.cudagraph_blockers})
        if DUMP_GPU_CODE:
            os.makedirs(DUMP_GPU_CODE, exist_ok=True)
            for i, program in enumerate(COMPILE_BACKEND.programs[graphs_before:]):
                with open(os.path.join(DUMP_GPU_CODE, f"{row['name']}-{i}-{program.kind}.py"), "w") as f:
                    f.write(program.code)
    row["compile_s"] = round(compilation.compile_seconds() - before, 1)
    row["eager_by_phase"], row["eager_launches"] = dict(row["by_phase"]), row["launches"]
    row["profiled_eager"] = {p: eager[p] for p in FWD_BWD}
    row["profiled_compiled"] = {p: compiled[p] for p in FWD_BWD}
    row["generated_kernels"] = by_op.get("generated", 0)
    row["compiled_top_ops"] = by_op.most_common(25)
    # a layer variant whose compile failed runs eager (umst_plugin.compilation.fallback): its kernels are eager ones,
    # so the row says which, and why (main() silences the logged warning with the start-up chatter)
    row.update(fallback_record(trainer.model))
    for p in FWD_BWD:
        row["by_phase"][p] = compiled[p]
    row["launches"] = sum(row["by_phase"].values())


def measure(name, arch, overrides, precision, plugin, quick, device="cpu", compile=False, lengths=None):
    from torch.utils.flop_counter import FlopCounterMode

    KernelLaunches = op_counts_module().KernelLaunches

    trainer, sample = build_trainer(arch, overrides, precision, plugin, quick, device, lengths)
    trainer.train_step([sample])  # warm-up: the optimizer's state and lazy buffers are built
    counter = KernelLaunches()
    instrument(trainer, counter)
    with counter:
        trainer.train_step([sample])
    with FlopCounterMode(display=False) as flops:
        trainer.train_step([sample])
    by_phase = {p: counter.by_phase.get(p, 0) for p in PHASES}
    top = {p: counter.top_ops(p, 8) for p in PHASES if by_phase[p]}
    params = sum(1 for p in trainer.model.parameters() if p.requires_grad)
    row = dict(name=name, arch=arch, precision=precision, plugin=plugin, launches=counter.total, by_phase=by_phase,
               top_ops=top, flops=flops.get_total_flops(), parameter_tensors=params,
               optimizer=type(trainer.optimizer.optimizer).__name__,
               sentences=int(sample["nsentences"]), target_tokens=int(sample["ntokens"]),
               source_tokens=int(sample["net_input"]["src_lengths"].sum()),
               padded_source_tokens=int(sample["net_input"]["src_tokens"].numel()),
               padded_target_tokens=int(sample["target"].numel()))
    if compile:
        compile_and_count(trainer, sample, row, device)
    if str(device).startswith("cuda"):  # what the GPU ran: kernels by phase from the profiler, busy
        row["cuda"] = benchmark_common().cuda_profile(lambda: trainer.train_step([sample]))
    return row


def benchmark_common():
    from benchmarks import common

    return common


def op_counts_module():
    """``umst_dev.op_counts`` (it imports torch only: the stock process may load it without the plugin)."""
    from umst_dev import op_counts

    return op_counts


def floored_family_rows():
    """The families' own rows (named as the family) that have a floor of their shape: the archs whose compiled
    launch rate has a target (at most stock's eager per FLOP, or within 10% of a transformer of their own shape)."""
    from umst_plugin import families

    floor_of = floors()
    return [f.name for f in families.all_families() if f.name in floor_of]


def stock_row(precision, quick, device="cpu", lengths=None):
    """The stock transformer's row, measured in a child process that never imports the plugin."""
    argv = [sys.executable, "-m", "benchmarks.bench_launches", "--stock", "--precision", precision, "--device", device]
    if quick:
        argv.append("--quick")
    if lengths is not None:
        argv += ["--batch-lengths", json.dumps(lengths)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"the stock measurement failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ratios(rows):
    stock = next(r for r in rows if r["name"] == "stock")
    per_flop = stock["launches"] / stock["flops"]
    for r in rows:
        r["flops_ratio"] = r["flops"] / stock["flops"]
        r["launches_per_flop_ratio"] = r["launches"] / r["flops"] / per_flop
        r["fwd_bwd_per_flop_ratio"] = ((r["by_phase"]["forward"] + r["by_phase"]["backward"]) / r["flops"]) / (
            (stock["by_phase"]["forward"] + stock["by_phase"]["backward"]) / stock["flops"])
        if "profiled_compiled" in r:  # --compile: the compiled layers against the same model's eager ones
            r["compiled_vs_eager_fwd_bwd"] = sum(r["profiled_compiled"].values()) / sum(r["profiled_eager"].values())
            r["compiled_vs_eager"] = r["launches"] / r["eager_launches"]
    for r in rows:
        floor = next((f for f in rows if f["name"] == floors().get(r["name"])), None)
        if floor is not None:  # --floor: forward + backward per FLOP against a transformer of the row's shape
            r["fwd_bwd_vs_floor"] = r["fwd_bwd_per_flop_ratio"] / floor["fwd_bwd_per_flop_ratio"]
    traffic_ratios(rows)
    return rows


TRAFFIC_PHASES = ("forward", "backward", "forward + backward")


def _traffic_phase(traffic, phase):
    if phase in traffic:
        return traffic[phase]
    return {key: sum(traffic[p][key] for p in FWD_BWD) for key in traffic["forward"]}


def traffic_ratios(rows):
    """``--simulate-gpu``: each row's compiled layers' bytes and kernels per FLOP (the layers' own matrix-product
    and attention FLOPs), forward, backward and both, and both against the plugin transformer's of the same run
    (``vs_transformer``) and against the transformer of the row's own shape (``vs_own_shape``, ``--floor``)."""
    def per_flop(r):
        out = {}
        for phase in TRAFFIC_PHASES:
            t = _traffic_phase(r["simulated_traffic"], phase)
            out[phase] = dict(bytes_per_flop=t["bytes"] / t["flops"] if t["flops"] else None,
                              kernels_per_gflop=t["launches"] / t["flops"] * 1e9 if t["flops"] else None)
        return out

    def against(mine, theirs):
        return {phase: {key: (mine[phase][key] / theirs[phase][key] if mine[phase][key] and theirs[phase][key]
                              else None) for key in mine[phase]} for phase in TRAFFIC_PHASES}

    measured = {r["name"]: r for r in rows if "simulated_traffic" in r}
    for r in measured.values():
        r["traffic_per_flop"] = per_flop(r)
    reference = measured.get("transformer")
    for r in measured.values():
        if reference is not None:
            r["traffic_vs_transformer"] = against(r["traffic_per_flop"], reference["traffic_per_flop"])
        floor = measured.get(floors().get(r["name"]))
        if floor is not None:
            r["traffic_vs_own_shape"] = against(r["traffic_per_flop"], floor["traffic_per_flop"])


def traffic_markdown(result):
    """The ``--simulate-gpu`` table: the compiled layers' FLOPs, kernels and bytes moved in one update, forward and
    backward apart, per FLOP against the plugin transformer's (and the row's own shape's, ``--floor``)."""
    rows = [r for r in result["rows"] if "simulated_traffic" in r]
    if not rows:
        return ""
    floors = any("traffic_vs_own_shape" in r for r in rows)
    head = ["arch", "layers' GFLOP fwd + bwd", "kernels fwd + bwd", "GB moved fwd + bwd", "bytes/FLOP fwd, bwd",
            "bytes/FLOP vs transformer fwd, bwd (both)", "kernels/FLOP vs transformer fwd, bwd (both)"]
    if floors:
        head += ["bytes/FLOP vs own shape (both)", "kernels/FLOP vs own shape (both)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]

    def pair(values, fmt):
        return " + ".join(format(v, fmt) for v in values)

    def ratios(r, key, measure):
        if key not in r:
            return "-"
        f, b, both = (r[key][phase][measure] for phase in TRAFFIC_PHASES)
        return f"{f:.2f}, {b:.2f} ({both:.2f})" if None not in (f, b, both) else "-"

    for r in rows:
        t, per = r["simulated_traffic"], r["traffic_per_flop"]
        cells = [label_of(r["name"], r["arch"]) + benchmark_common().partly_eager(r),
                 pair((t[p]["flops"] / 1e9 for p in FWD_BWD), ".1f"), pair((t[p]["launches"] for p in FWD_BWD), ","),
                 pair((t[p]["bytes"] / 1e9 for p in FWD_BWD), ".2f"),
                 ", ".join(f"{per[p]['bytes_per_flop']:.4f}" if per[p]["bytes_per_flop"] else "-" for p in FWD_BWD),
                 ratios(r, "traffic_vs_transformer", "bytes_per_flop"),
                 ratios(r, "traffic_vs_transformer", "kernels_per_gflop")]
        if floors:
            cells += [ratios(r, "traffic_vs_own_shape", m).split(" (")[-1].rstrip(")") if "traffic_vs_own_shape" in r
                      else "-" for m in ("bytes_per_flop", "kernels_per_gflop")]
        lines.append("| " + " | ".join(cells) + " |")
    unsized = [f"{r['name']}: {sum(t['unsized'] for t in r['simulated_traffic'].values())}" for r in rows
               if any(t["unsized"] for t in r["simulated_traffic"].values())]
    if unsized:
        lines.append("")
        lines.append("Launches without a byte estimate (counted as 0 bytes): " + ", ".join(unsized))
    return "\n".join(lines)


def markdown(result):
    """The table: launches by phase and per FLOP against stock; on CUDA also the profiler's kernels (and their
    ratio to the count), the update's wall time and GPU busy. With ``--compile`` the compiled update against the
    same model's eager one, forward and backward (the other phases are the eager table's; the seconds of compiling
    are in the JSON, ``compile_s``: a count is exact under any load, a time is not)."""
    cuda = any("cuda" in r for r in result["rows"])
    compiled = any("compile_s" in r for r in result["rows"])
    phases = FWD_BWD if compiled else PHASES
    head = ["arch", "GFLOP", "launches"] + list(phases)
    if compiled:
        head += ["eager launches", "compiled / eager", "fwd+bwd compiled / eager", "generated kernels"]
    head += ["per FLOP vs stock", "fwd+bwd per FLOP"]
    floors = any("fwd_bwd_vs_floor" in r for r in result["rows"])
    if floors:
        head.append("fwd+bwd per FLOP vs own shape")
    if cuda:
        head += ["CUDA kernels", "kernels / count", "update ms", "GPU busy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in result["rows"]:
        cells = [label_of(r["name"], r["arch"]) + benchmark_common().partly_eager(r), f"{r['flops'] / 1e9:.0f}",
                 f"{r['launches']:,}"]
        cells += [f"{r['by_phase'][p]:,}" for p in phases]
        if compiled:
            cells += ([f"{r['eager_launches']:,}", f"{r['compiled_vs_eager']:.2f}", f"{r['compiled_vs_eager_fwd_bwd']:.2f}",
                       f"{r['generated_kernels']:,}"] if "compile_s" in r else ["-"] * 4)
        cells += [f"{r['launches_per_flop_ratio']:.2f}", f"{r['fwd_bwd_per_flop_ratio']:.2f}"]
        if floors:
            cells.append(f"{r['fwd_bwd_vs_floor']:.2f}" if "fwd_bwd_vs_floor" in r else "-")
        if cuda:
            c = r.get("cuda") or {}
            cells += [f"{c['kernels']:,}", f"{c['kernels'] / r['launches']:.2f}", f"{c['wall_ms']:.1f}",
                      f"{c['busy']:.2f}"] if c else ["-"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    lines += benchmark_common().eager_fallback_lines([(label_of(r["name"], r["arch"]), r) for r in result["rows"]])
    traffic = traffic_markdown(result)
    if traffic:
        lines += ["", traffic]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", default=None,
                   help="comma-separated rows (default: every row but the extra ones, which are run by name: a "
                        "trade-off flag's variant, a WMT recipe's shape; python -m benchmarks.harness lists them); "
                        "'floored': the families' own rows (named as the family) that have a floor of their shape, "
                        "the rows whose compiled launch rate has a target")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="fp32, or --amp in bf16 / fp16 (the stock row: fairseq's own --amp, fp16 on CUDA only)")
    p.add_argument("--quick", action="store_true", help="tiny widths: a smoke run")
    p.add_argument("--device", default="cpu",
                   help="cpu (default: the count, anywhere) or cuda (also the profiler's kernels by phase, the wall "
                        "time of an update and GPU busy)")
    p.add_argument("--compile", action="store_true",
                   help="also compile each plugin row's layers as fairseq-train --compile does and count a compiled "
                        "update (forward and backward from the profiler, the generated kernels included); the stock "
                        "row stays eager, as without the plugin")
    p.add_argument("--simulate-gpu", metavar="DEVICE", choices=("h200",), default=None,
                   help="with --compile on a CPU: count the compiled layers as inductor's GPU program for this device "
                        "(Triton kernels and library calls, generated here and not run; needs a CUDA build of torch "
                        "with Triton, umst_dev/simulated_gpu.py); eager parts stay this CPU's count")
    p.add_argument("--floor", action="store_true",
                   help="also count a transformer of the same shape as each row that has one (a family's "
                        "BenchRow.shape_baseline, counted post-norm; or a model of the family's shape that its paper "
                        "table defines) and give the row's forward + backward per FLOP against it: what its shape "
                        "alone costs")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="count one full batch of this many tokens (sentences x the longer side, as fairseq packs) "
                        "with the lengths of --lengths (harness.lengths_batch), instead of 32 sentences of up "
                        "to 25 tokens")
    p.add_argument("--lengths", choices=("multi30k", "wmt14"), default="multi30k",
                   help="with --max-tokens: the length distribution (Multi30k's pairs, or WMT14 En-De's after BPE)")
    p.add_argument("--dump-gpu-code", metavar="DIR", default=None,
                   help="with --simulate-gpu: write each generated GPU program (inductor's wrapper, the Triton kernels "
                        "inside) to DIR, ROW-INDEX-forward/backward.py")
    p.add_argument("--batch-lengths", default=None, help=argparse.SUPPRESS)  # the stock child's batch
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", default=None, help="also write the table here")
    p.add_argument("--dry-run", action="store_true", help="check the arguments and the arch names, measure nothing")
    p.add_argument("--stock", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--top", action="store_true", help="also print each row's most launching ops per phase")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    import logging
    import warnings

    logging.disable(logging.WARNING)  # fairseq's and hydra's start-up chatter
    warnings.filterwarnings("ignore")
    lengths = json.loads(args.batch_lengths) if args.batch_lengths else None
    if args.stock:  # child process: fairseq alone
        row = measure("stock", "transformer", harness.PRENORM, "fp16" if args.precision != "fp32" else "fp32", False,
                      dict(harness.QUICK) if args.quick else None, args.device, lengths=lengths)
        assert "umst_plugin" not in sys.modules, "the stock row imported the plugin"
        print(json.dumps(row))
        return 0
    rows_known = launch_rows()  # (after --stock: the stock process must not import the plugin)
    if args.archs == "floored":
        args.archs = ",".join(floored_family_rows())
    default = ",".join(n for n, r in rows_known.items() if not r.get("extra"))
    names = [n for n in (args.archs if args.archs is not None else default).split(",") if n]
    unknown = [n for n in names if n not in rows_known]
    if unknown:
        p.error(f"unknown arch(s) {unknown}; choices: {', '.join(rows_known)}")
    if args.floor:
        floor_of = floors()
        names += [f for f in dict.fromkeys(floor_of[n] for n in names if n in floor_of) if f not in names]
    if args.simulate_gpu:
        if not args.compile or args.device != "cpu":
            p.error("--simulate-gpu counts compiled layers on a CPU: give --compile and leave --device cpu")
        import umst_plugin  # noqa: F401  (the archs, before the backend)
        from umst_dev import simulated_gpu

        why = simulated_gpu.unavailable()
        if why:
            p.error(f"--simulate-gpu: {why}; run it under a CUDA build of torch (docs/compile.md)")
        global COMPILE_BACKEND
        COMPILE_BACKEND = simulated_gpu.Backend(args.simulate_gpu)
    if args.dump_gpu_code and not args.simulate_gpu:
        p.error("--dump-gpu-code writes the programs --simulate-gpu generates: give --simulate-gpu")
    if args.dump_gpu_code:
        global DUMP_GPU_CODE
        DUMP_GPU_CODE = args.dump_gpu_code
    if args.max_tokens:
        lengths = harness.lengths_batch(args.max_tokens,
                                        lengths="wmt14" if args.lengths == "wmt14" else harness.LENGTHS)
    batch = (f"{len(lengths[0])} sentences of {args.lengths}'s lengths, {args.max_tokens:,} tokens" if lengths
             else f"{SENTENCES} sentences of up to {MAX_LEN} tokens")
    if args.dry_run:
        print(f"bench_launches: would count one update of stock and {names} in {args.precision} on {args.device}, "
              f"{batch}")
        return 0
    start = time.time()
    rows = [stock_row(args.precision, args.quick, args.device, lengths)]
    if args.compile and not args.device.startswith("cuda") and COMPILE_BACKEND == "inductor":
        # the profiler sees inductor's C++ kernels only when they are compiled to report themselves (on a GPU
        # Triton's launches report themselves; leaving the setting alone there keeps inductor's cache of the other
        # benchmarks' programs valid: the setting is part of its key)
        import umst_plugin  # noqa: F401  (the archs; before inductor's settings, which the plugin does not touch)
        from umst_dev.op_counts import count_generated_kernels

        count_generated_kernels().__enter__()  # for the whole process: every compilation below
    from benchmarks import common

    def result_so_far():
        return dict(device=common.device_name(args.device), torch=torch.__version__, precision=args.precision,
                    simulated_gpu=args.simulate_gpu,
                    quick=args.quick, compile=args.compile, batch=batch, max_tokens=args.max_tokens,
                    lengths=args.lengths if lengths else None,
                    sentences=len(lengths[0]) if lengths else SENTENCES, max_len=None if lengths else MAX_LEN,
                    rows=ratios(rows),
                    seconds=round(time.time() - start, 1))

    for name in names:
        spec = rows_known[name]
        if spec.get("register"):  # a model of a family's shape, registered by the benchmark
            spec["register"]()
        quick = dict(harness.QUICK, **spec.get("quick", {})) if args.quick else None
        row_start = time.time()
        rows.append(measure(name, spec["arch"], dict(spec["overrides"]), args.precision, True, quick, args.device,
                            args.compile, lengths))
        rows[-1]["wall_s"] = round(time.time() - row_start, 1)
        print(f"  {name}: {rows[-1]['launches']:,} launches, {rows[-1]['flops'] / 1e9:.1f} GFLOP"
              + (f", compiled in {rows[-1]['compile_s']:.0f} s (eager {rows[-1]['eager_launches']:,})"
                 if args.compile else "")
              + (", layers' traffic (forward, backward): " + "; ".join(
                  f"{t['launches']:,} kernels, {t['bytes'] / 1e9:.2f} GB, {t['flops'] / 1e9:.1f} GFLOP"
                  for t in (rows[-1]["simulated_traffic"][p] for p in FWD_BWD))
                 if "simulated_traffic" in rows[-1] else "")
              + common.fell_back(rows[-1]), flush=True)
        partial = result_so_far()  # after every row: a run stopped at a time limit keeps the rows it counted
        common.write_results(partial, markdown(partial), args.json, args.markdown)
    result = result_so_far()
    table = markdown(result)
    simulated = f" (counted as inductor's program for a simulated {args.simulate_gpu})" if args.simulate_gpu else ""
    print(f"\n{result['device']}, torch {result['torch']}, {args.precision}{', layers compiled' if args.compile else ''}{simulated}, one update of {batch}\n\n{table}")
    if args.top:
        for r in rows:
            print(f"\n{r['name']}: " + "; ".join(f"{ph}: " + ", ".join(f"{op} {n}" for op, n in ops)
                                                 for ph, ops in r["top_ops"].items()))
            if "compiled_top_ops" in r:
                print(f"{r['name']} compiled update, most launching ops: "
                      + ", ".join(f"{op} {n}" for op, n in r["compiled_top_ops"]))
    common.write_results(result, table, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
