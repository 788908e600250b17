"""The speed table: the words per second ``fairseq-train`` gives per arch on one GPU at the recipe's batch.

    bash scripts/gpu-speed.sh                          # a lent GPU's first call (install from the wheelhouse, then this)
    python -m benchmarks speed-table --tiny --out DIR  # any machine, CI included: the same plan at tiny sizes

How it trains. Every row is ``fairseq-train`` through its own command line (``fairseq_cli.train.main`` on
fairseq-train's argv, as the console script calls it) on a synthetic corpus with WMT14 En-De's sentence lengths
after BPE (``synthetic_corpus.py --lengths wmt14``: log-normal source lengths of mean 28 tokens with a tail to
250, targets about 5% longer; 48,000 training pairs over a 32,768-entry joined dictionary, WMT14's BPE
vocabulary size; gold dependency trees as UMST's side files). The batch is the recipe's batch per card,
``--max-tokens 38400`` (docs/wmt-on-gpus.md: 38,400 x update-freq x cards = the papers' 614,400 tokens per
update on 1, 8 or 16 cards), then 4,096 for contrast where time allows. Each row trains ``--updates`` updates
(default 24) with ``--log-interval`` 4 and fairseq's own data loading; the recipe's optimizer (adam, inverse
square root schedule) with a short warm-up and a higher rate than the recipe's so that the loss moves within
the row (a compiled row's losses are compared with its eager row's).

Rows, in this order (the first table is the recipe batch's; a call cut short keeps what it finished):

* stock fairseq's transformer (pre-norm, ``--task translation``) with ``--fp16`` (fairseq's flat fp16
  optimizer) and with ``--amp`` (fp16 autocast), in a process that never imports the plugin;
* the plugin's transformer (``--user-dir umst_plugin --task multiscale_translation``) in bf16 (``--amp
  --amp-dtype bfloat16``), eager and ``--compile``, and in fp32 with ``--tf32``;
* UMST, UMST-RPR, TranSFormer, MSC, MSMSA, Prime and Prime-simple (base), each in bf16, eager and ``--compile``;
* Prime at the shape of its WMT14 base recipe (``prime_muse``: UMST's MUSE, ``prime_base`` at 6+6 layers of d 512,
  ``configs/umst-t2-muse-base.yaml``), bf16, eager and ``--compile``: ``prime_base``'s own 12+12 layers of d 384
  are the Prime paper's IWSLT model, which no WMT recipe trains (``harness.recipe_rows``).

Per row: ``words_per_s`` (the median of fairseq's own ``wps`` over the log intervals after the first, which
holds the warm-up); ``target_tokens_per_step`` (fairseq's ``wpb``, the median over the same intervals: what a row's
hours are computed from, ``umst_tools.batch_table``); real and padded tokens per step (source + target, the median
over the measured updates) and
``batch_fill``, the batch against its budget (sentences x the longer side, what ``--max-tokens`` bounds, after
fairseq rounds the sentences down to a multiple of 8) and ``sentences_per_step``;
``flops_per_token``, the project's model FLOPs (``torch.utils.flop_counter.FlopCounterMode``: matmuls,
convolutions and attention of forward and backward, as ``bench_archs.py`` counts them) of one whole update (the
second, inside the dropped warm-up interval; the next where ``--amp`` retried it) over its target tokens -- a
compiled row takes its eager row's count (the same batches); ``mfu``: words/s x FLOPs per token over the card's
dense bf16 peak (:data:`DENSE_BF16_PEAK`); ``peak_mib``: ``torch.cuda.max_memory_allocated`` over the whole run
(:class:`PeakMemory`: fairseq resets it at every logged update); ``gpu_busy``: nvidia-smi's ``utilization.gpu``
(the share of time a kernel ran) sampled every 50 ms (no profiler), averaged over each measured log interval
(``gpu_busy_intervals``), and the median of those, as words/s is the median of the same intervals' words/s;
``between_updates_ms`` and ``train_step_ms``: the host's time between one measured update's ``train_step`` and the
next one's (fairseq's loop waiting for the data loader's next batch, and logging) and inside ``train_step``, the
medians (:class:`StepProbe`; no device sync): where an idle GPU's time goes;
``kernels``: update :data:`PROFILE_UPDATE` (in the dropped first interval) run once under torch.profiler on a
GPU: its kernels, their summed time, the share of that time by what each kernel's name says it does
(``benchmarks.common.kernel_breakdown``: matmul, attention, softmax and loss, layer norm, copies and casts, ...), the
longest kernels, and ``kernel_mfu`` (the update's FLOPs over its kernel time alone: the kernels' own efficiency,
the host's waits apart); ``compile_s``: compiling apart -- every compiled row is first compiled by a process of
its own, as many at once as the card's memory holds (:func:`warm_up`), into a shared inductor cache
(``compile_s``: that cold compile, kept from the first call that made it; ``compile_s_in_row``: the measured run's,
from the warm cache; ``compile_cache_in_row`` and the warm-up's ``compile_cache``: torch's hits and misses of its
FX graph and AOTAutograd caches, :data:`CACHE_COUNTERS`, which say whether a row compiled anew); ``losses``:
(update, loss) at each logged update. A compiled row's losses must equal its eager row's within noise, measured
in the same call (:func:`loss_check`): compiled code draws its dropout masks from inductor's own random stream
and keeps fused intermediates in fp32, so the tolerance is twice the sum of the dropout noise (the compiled row
against its warm-up run, which trains the same updates with other dropout masks) and the bf16 noise (the plugin
transformer's bf16 against its fp32 losses, the same masks); a row outside it is marked (``loss_check``). A
``--compile-cudagraphs`` row's ``cudagraph_shapes``: per layer class, the batch shapes recorded as CUDA graphs in
the process and the calls beyond ``--compile-cudagraph-shapes``' cap, which ran without graphs.

The record, rewritten after every row: ``OUT/gpu-speed-<card>-<commit>.json`` (on a CPU ``speed-cpu-...``)
with the commit, the card, the corpus and a ``rows`` list, each row with ``arch``, ``stock``, ``precision``,
``compiled``, ``max_tokens``, ``words_per_s``, ``mfu``, ``gpu_busy``, ``peak_mib``, ``compile_s``, ``losses``
and the rest above; ``targets`` (:func:`targets`); the table as markdown beside it, and the log of every
process. The same command run again keeps the rows of the same plan already done and runs the rest.
``--deadline`` (seconds for the whole call) skips what has no time left.

On a CPU the numbers mean nothing (fairseq's ``--fp16`` needs CUDA, so that row is skipped; no nvidia-smi, no
peak): ``--tiny`` runs
the same plan at tiny widths and batches, compiled rows for the transformer only (inductor's C++ compile of every
arch takes minutes on a CPU; tests/test_compile.py compiles each), so that a lent GPU never meets a bug a CPU
could have shown.
"""
import argparse
import faulthandler
import gc
import hashlib
import importlib.util
import json
import logging
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time

from benchmarks import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(ROOT, "docs", "results")  # the committed speed records
PLUGIN = os.path.join(ROOT, "umst_plugin")

RECIPE_MAX_TOKENS = 38400  # tokens per card per step in the WMT recipes on an 80 GB or larger card
CONTRAST_MAX_TOKENS = 4096
CORPUS = dict(train=48000, valid=200, test=200, vocab=32768, lengths="wmt14")
STACK_SIGNAL = signal.SIGUSR2  # a warm-up writes its threads' stacks to its log on it (faulthandler)
MAIN_THREAD_LINE = "[warm-up] the training thread:"  # then its id as faulthandler writes it, in a warm-up's log
# for those stacks at most, before the warm-ups stopped at the cap are killed: faulthandler writes them when the
# process next runs, which under load (CI's three workers on two cores) took more than the 2 s first waited
STACK_WAIT_S = 10.0
CORPUS_STAMP = "speed-corpus.json"  # beside the corpus's data-bin: corpus_stamp() of the corpus it holds
TINY_CORPUS = dict(train=600, valid=50, test=50, vocab=1000, lengths="wmt14")
TINY_MAX_TOKENS = "1024,256"
# dense (no sparsity) bf16 tensor-core peak by the vendors' datasheets, FLOP/s, by a name fragment of the card
DENSE_BF16_PEAK = (("H200", 989.4e12), ("H100 PCIe", 756.0e12), ("H100", 989.4e12), ("A100", 312.0e12),
                   ("L40S", 362.1e12), ("A10G", 70.0e12))
PRECISION_ARGS = {"fp16": ["--fp16"], "fp16-amp": ["--amp"], "bf16": ["--amp", "--amp-dtype", "bfloat16"],
                  "tf32": ["--tf32"]}
DROPOUT_SHIFT = 1_000_003  # the warm-up's dropout masks: another stream, the same everything else
LOSS_RESOLUTION = 0.001  # fairseq logs the loss to 3 decimals
FLOPS_UPDATE = 1  # the update (0-based) whose FLOPs an eager row counts: the second, inside the dropped interval
PROFILE_UPDATE = 2  # the update a CUDA row runs under torch.profiler (kernel time by category): also dropped
BUSY_PERIOD_MS = 50
LOSS_NOISE_MARGIN = 2.0
MIN_ROW_SECONDS = 12  # a row is not started with less time left before the deadline
# A compile warm-up's device memory per 1,000 tokens of --max-tokens: the largest peak of a row at 38,400 tokens on
# the H200 at af33e1d (MSC compiled, 30.6 GiB by fairseq's gb_free). All eight warm-ups at once needed about 230 GiB
# there and ran out of memory (fairseq skipped batches, which moved their losses). The warm-ups allocate with
# expandable segments (less held back by fragmentation, as dynamic shapes cause) and take 0.95 of the card.
WARM_UP_GIB_PER_KTOKEN = 0.8

# --cudagraphs: the archs, fairseq's length buckets and the updates a row (CUDA graphs are recorded once per batch
# shape in each process: 96 updates of 38,400 tokens over WMT14's lengths in 8 buckets meet each shape several times)
CUDAGRAPH_ARCHS = "transformer,umst"
CUDAGRAPH_BUCKETS = 8
CUDAGRAPH_UPDATES = 96

# targets on one card at the recipe batch (bf16); the record says which are met
TARGETS = dict(transformer_vs_stock_fp16=1.5, transformer_mfu=0.30, words_per_flop_vs_transformer=0.8,
               gpu_busy=0.7, bf16_vs_tf32=2.0)


def fairseq_args(data, arch, arch_args, max_tokens, updates, log_interval, seed=1):
    return [data, "--arch", arch, *arch_args, "--share-all-embeddings", "--optimizer", "adam",
            "--adam-betas", "(0.9,0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "8",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--max-tokens", str(max_tokens), "--max-update", str(updates), "--seed", str(seed),
            "--no-save", "--disable-validation", "--no-epoch-checkpoints", "--log-format", "json",
            "--log-interval", str(log_interval), "--no-progress-bar"]


def plan(data, max_tokens_list, updates, log_interval, archs, compile_archs, tiny=False, rows=None,
         cudagraph_buckets=None):
    """(stock rows, plugin rows), each a dict(name, arch, stock, precision, compiled, max_tokens, argv), in the
    order they run: every row of the first batch size, then of the next. At the first, after the archs, the
    transformer of an arch's own shape where the arch has one (``harness.shape_baselines``: Prime's 12+12 layers at
    width 384), marked ``baseline_row``: no target counts it; an arch's ``words_per_flop_vs_own_shape`` is against
    it. With ``cudagraph_buckets`` the CUDA graph plan instead (:func:`cudagraph_plan`)."""
    stock, plugin = [], []
    shape_of = harness.shape_baselines(rows)
    for max_tokens in max_tokens_list:
        def row(name, precision, compiled=False, is_stock=False, extra=()):
            arch, overrides = harness.model_overrides(name, rows=rows)
            argv = fairseq_args(data, arch, harness.overrides_to_argv(overrides), max_tokens, updates, log_interval)
            # --tiny: a one-layer smoke run (one block where a family counts blocks)
            argv += harness.overrides_to_argv(harness.quick_overrides(name, layers=1, rows=rows)) if tiny else []
            argv += ["--task", "translation"] if is_stock else ["--user-dir", PLUGIN, "--task", "multiscale_translation"]
            argv += PRECISION_ARGS[precision] + (["--compile"] if compiled else []) + list(extra)
            return dict(name=("stock " if is_stock else "") + name, arch=arch, stock=is_stock, precision=precision,
                        compiled=compiled, max_tokens=max_tokens, argv=argv)
        if cudagraph_buckets:
            plugin += cudagraph_plan(row, archs, cudagraph_buckets)
            continue
        stock += [row("transformer", "fp16", is_stock=True), row("transformer", "fp16-amp", is_stock=True)]
        bases = dict.fromkeys(shape_of[n] for n in archs if n in shape_of)  # in the archs' order
        for name in archs:
            if name in bases:  # named in --archs beside an arch it is the shape of: its baseline rows below, once
                continue
            plugin.append(dict(row(name, "bf16"), shape_baseline=shape_of.get(name)))
            if name in compile_archs:
                plugin.append(dict(row(name, "bf16", compiled=True), shape_baseline=shape_of.get(name)))
            if name == "transformer":
                plugin.append(row(name, "tf32"))
        if max_tokens == max_tokens_list[0]:  # a transformer of an arch's own shape: is its cost per FLOP the shape's?
            for base in bases:
                plugin.append(dict(row(base, "bf16"), baseline_row=True))
                if any(shape_of.get(n) == base for n in archs if n in compile_archs):
                    plugin.append(dict(row(base, "bf16", compiled=True), baseline_row=True))
    return stock, plugin


def cudagraph_plan(row, archs, buckets):
    """The rows of ``--cudagraphs`` for each arch at one batch size: bf16 eager (its FLOPs per token), ``--compile``
    on batches padded to ``buckets`` lengths (``--num-batch-buckets``: fairseq's fixed batch shapes), and the same
    with ``--compile-cudagraphs``, whose layers replay one CUDA graph per shape. A bucketed row is a ``variant_of``
    its arch (its FLOPs per token, model FLOPs per real token, from the arch's eager row); the CUDA graph row's
    losses are compared with the bucketed row's (``loss_reference``: the same batches)."""
    bucketed = ["--num-batch-buckets", str(buckets)]
    out = []
    for name in archs:
        out.append(row(name, "bf16"))
        out.append(dict(row(name, "bf16", compiled=True, extra=bucketed), name=f"{name} buckets", variant_of=name))
        out.append(dict(row(name, "bf16", compiled=True, extra=bucketed + ["--compile-cudagraphs"]),
                        name=f"{name} cudagraphs", variant_of=name, loss_reference=f"{name} buckets"))
    return out


# ---- in a row's process: fairseq-train with a probe on its trainer ---------------------------------------------

class GpuBusy:
    """nvidia-smi's ``utilization.gpu`` (the percent of the last sample period in which a kernel ran) read every
    ``period_ms`` in a thread, each value stamped with the time it was read; ``between(t0, t1)`` is the mean over
    that span as a fraction. ``available`` is False where nvidia-smi is missing (a CPU)."""

    def __init__(self, device_index=0, period_ms=BUSY_PERIOD_MS, enabled=True):
        self.samples, self.proc = [], None
        if not enabled:
            return
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                          "-i", str(device_index), "-lms", str(period_ms)],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None
            return
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    @property
    def available(self):
        return self.proc is not None

    def _read(self):
        for line in self.proc.stdout:
            value = parse_utilization(line)
            if value is not None:
                self.samples.append((time.monotonic(), value))

    def between(self, t0, t1):
        kept = [v for t, v in self.samples if t0 <= t <= t1]
        return round(sum(kept) / len(kept) / 100.0, 3) if kept else None

    def per_interval(self, stamps):
        """The busy fraction of each span between consecutive ``stamps`` (the log intervals' ends)."""
        return [self.between(a, b) for a, b in zip(stamps, stamps[1:])]

    def of_intervals(self, stamps):
        """(the busy fraction of each log interval after the first, their median or None): the intervals whose
        words/s the row's words/s is the median of (the first holds the start-up and, compiled, the compiling)."""
        intervals = self.per_interval(stamps)
        measured = [b for b in intervals if b is not None]
        return intervals, round(statistics.median(measured), 3) if measured else None

    def close(self):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()


def parse_utilization(line):
    """A percentage from one line of ``nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits``
    ("87"), or None for anything else ("[N/A]", an error line)."""
    try:
        return float(line.strip())
    except ValueError:
        return None


class StepProbe:
    """What a row measures around fairseq's ``Trainer.train_step``: the host time at the start of the first
    measured update and at the end of the last, each update's real and padded tokens (from the batch as the
    data loader gives it, on the CPU: no device sync), and the FLOPs of update :data:`FLOPS_UPDATE` (eager rows).
    fairseq's ``--amp`` retries a batch after an overflow by calling ``train_step`` again from inside it; the retry
    passes through uncounted (``retries``), and an update that was retried is not the one whose FLOPs are counted
    (it ran the model twice): the next one before the measured interval is."""

    def __init__(self, measured_from, count_flops, pad_index, profile=False):
        self.measured_from, self.count_flops, self.pad = measured_from, count_flops, pad_index
        self.profile, self.kernels = profile, None  # kernels: common.kernel_breakdown of PROFILE_UPDATE
        self.calls, self.t0, self.t1 = 0, None, None
        self.tokens = []  # (real, padded) per measured update
        self.flops = self.flops_tokens = None
        self.retries = 0  # fairseq's AMP retries of a batch (counted, not measured again)
        self._depth = 0
        # host seconds between one measured update's train_step and the next one's: fairseq's loop waiting for the
        # data loader's next batch (and its logging); and inside train_step (the host's part of an update)
        self.gaps, self.inside = [], []

    def step(self, train_step, samples, *args, **kwargs):
        if self._depth:  # fairseq's Trainer.train_step calling itself: --amp retrying the batch after an overflow
            self.retries += 1
            return train_step(samples, *args, **kwargs)
        index = self.calls
        self.calls += 1
        started = time.monotonic()
        if index == self.measured_from:
            self.t0 = started
        if index > self.measured_from:
            self.gaps.append(started - self.t1)
        if index >= self.measured_from:
            self.tokens.append(self._tokens(samples))
        retries = self.retries
        self._depth += 1
        try:
            if self.count_flops and self.flops is None and FLOPS_UPDATE <= index < max(self.measured_from,
                                                                                      FLOPS_UPDATE + 1):
                from torch.utils.flop_counter import FlopCounterMode

                with FlopCounterMode(display=False) as counter:
                    out = train_step(samples, *args, **kwargs)
                if self.retries == retries:  # a retried update ran the model twice: the next one is counted
                    self.flops = counter.get_total_flops()
                    self.flops_tokens = sum(int(s["ntokens"]) for s in samples if s)
            elif self.profile and index == PROFILE_UPDATE and index < self.measured_from:
                out = self._profiled(train_step, samples, *args, **kwargs)
            else:
                out = train_step(samples, *args, **kwargs)
        finally:
            self._depth -= 1
        self.t1 = time.monotonic()
        if index >= self.measured_from:
            self.inside.append(self.t1 - started)
        return out

    def _profiled(self, train_step, samples, *args, **kwargs):
        """One update under torch.profiler (CUDA kernels; a CPU has none), synchronised before and after: its
        kernel time by category (benchmarks.common.kernel_breakdown) and its target tokens."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        from benchmarks import common

        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            out = train_step(samples, *args, **kwargs)
            if cuda:
                torch.cuda.synchronize()
        self.kernels = dict(common.kernel_breakdown(prof.events()), update=PROFILE_UPDATE,
                            target_tokens=sum(int(s["ntokens"]) for s in samples if s))
        return out

    def _tokens(self, samples):
        """(real, padded, budgeted) tokens of one update and its sentences: source + target tokens without and with
        padding, and what ``--max-tokens`` bounds (sentences x the longer side's padded length, fairseq's
        ``num_tokens``)."""
        real = padded = budgeted = sentences = 0
        for sample in samples:
            if not sample:
                continue
            src, tgt = sample["net_input"]["src_tokens"], sample["target"]
            for t in (src, tgt):
                padded += t.numel()
                real += int((t != self.pad).sum())
            budgeted += src.shape[0] * max(src.shape[1], tgt.shape[1])
            sentences += src.shape[0]
        return real, padded, budgeted, sentences


def _trainer_with(probe, dropout_shift=0):
    """fairseq's Trainer class as it is now (with the plugin's patches, if loaded) with the probe on train_step;
    with ``dropout_shift``, each update's torch seed (fairseq's ``seed + updates``, which drives dropout) moved by
    it: the same model, batches and arithmetic with other dropout masks."""
    from fairseq import utils
    from fairseq.trainer import Trainer

    class ProbedTrainer(Trainer):
        def train_step(self, samples, raise_oom=False):
            return probe.step(super().train_step, samples, raise_oom)

        def _set_seed(self):
            utils.set_torch_seed(self.cfg.common.seed + self.get_num_updates() + dropout_shift)
    return ProbedTrainer


def _compile_state():
    """--compile's counters in this process (umst_plugin.compilation), or None where the plugin is not loaded."""
    if "umst_plugin.compilation" not in sys.modules:
        return None
    from umst_dev.compiled_layers import eager_variants
    from umst_plugin import compilation
    from umst_plugin.compilation import graph_shapes

    return dict(seconds=compilation.compile_seconds(), graphs=compilation.compiled_graphs(),
                fallbacks=[f"{name}: {why}" for (name, _), why in eager_variants().items()],
                graph_shapes=graph_shapes.counts(), cache=compile_cache_counts())


# torch's counters of its compile caches: inductor's FX graph cache (one lookup per forward or backward graph) and
# AOTAutograd's (one per joint graph). A compiled row runs after its warm-up filled the cache, so its graphs should
# all be hits; a miss says the row compiled a graph the warm-up did not make (the H200's rows compiled 4-111 s more)
CACHE_COUNTERS = (("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"),
                  ("inductor", "fxgraph_cache_bypass"), ("aot_autograd", "autograd_cache_hit"),
                  ("aot_autograd", "autograd_cache_miss"), ("aot_autograd", "autograd_cache_bypass"))


def compile_cache_counts():
    """{counter: count} of :data:`CACHE_COUNTERS` in this process so far."""
    from torch._dynamo.utils import counters

    return {name: int(counters[group][name]) for group, name in CACHE_COUNTERS}


def cache_difference(before, after):
    """The cache counts between two :func:`compile_cache_counts` (an older state without them: None)."""
    if before is None or after is None:
        return None
    return {name: after[name] - before.get(name, 0) for name in after}


def train(argv, probe=None, dropout_shift=0):
    """fairseq-train's main on ``argv`` in this process (with ``probe`` on its trainer, and its dropout masks
    shifted by ``dropout_shift``: :func:`_trainer_with`): its train_inner records and wall seconds."""
    from benchmarks import common  # (here: the parent process runs before torch is installed)

    return common.train_in_process(argv, None if probe is None else _trainer_with(probe, dropout_shift))


def device_info():
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return dict(card=torch.cuda.get_device_name(0), memory_gib=round(props.total_memory / 2 ** 30, 1),
                    cuda=torch.version.cuda, torch=torch.__version__, python=sys.version.split()[0])
    return dict(card=None, cpu=cpu_name(), torch=torch.__version__, python=sys.version.split()[0])


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        import platform

        return platform.processor() or "unknown CPU"
    isa = "AVX-512" if "avx512f" in flags else "AVX2"
    return f"{model}, {isa}{', avx512_bf16' if 'avx512_bf16' in flags else ''}{', AMX' if 'amx_bf16' in flags else ''}, " \
           f"{os.cpu_count()} cores"


class PeakMemory:
    """``torch.cuda.max_memory_allocated`` over a whole run, in MiB (``mib``; None without CUDA). fairseq's trainer
    resets the peak at every logged update (to log ``gb_free``), so the peak left at the end is only the last
    interval's, or the memory after training; here each reset first takes the peak so far."""

    def __init__(self, cuda):
        self.cuda, self.bytes = cuda, 0

    def __enter__(self):
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
            self._reset = torch.cuda.reset_peak_memory_stats

            def reset(*args, **kwargs):
                self.bytes = max(self.bytes, torch.cuda.max_memory_allocated())
                return self._reset(*args, **kwargs)
            torch.cuda.reset_peak_memory_stats = reset
        return self

    def __exit__(self, *exc):
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats = self._reset
            self.bytes = max(self.bytes, torch.cuda.max_memory_allocated())
        return False

    @property
    def mib(self):
        return round(self.bytes / 2 ** 20) if self.cuda else None


def run_row(row, measured_from, busy):
    """Train one row in this process; its record (the fields of the module docstring)."""
    import torch

    cuda = torch.cuda.is_available()
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    from fairseq.data import Dictionary

    pad = Dictionary().pad()  # fairseq's dictionaries put <pad> at 1
    probe = StepProbe(measured_from, count_flops=not row["compiled"], pad_index=pad, profile=cuda)
    before = _compile_state() if row["compiled"] else None
    with PeakMemory(cuda) as peak:
        records, seconds = train(row["argv"], probe)
    after = _compile_state() if row["compiled"] else None
    return row_result(row, records, seconds, probe, peak.mib, busy, before, after)


def row_result(row, records, seconds, probe, peak_mib, busy, before=None, after=None):
    """A row's record (the fields of the module docstring) from what its run measured: fairseq's train_inner
    ``records`` (each stamped ``logged_at``) and wall ``seconds``, the :class:`StepProbe` on its trainer, its peak
    memory in MiB, the :class:`GpuBusy` sampler and, for a compiled row, :func:`_compile_state` before and after."""
    wps = [float(r["wps"]) for r in records]
    out = dict(row, seconds=round(seconds, 1), updates=int(float(records[-1]["num_updates"])) if records else 0,
               words_per_s=round(statistics.median(wps[1:]), 1) if len(wps) > 1 else None,
               target_tokens_per_step=statistics.median(float(r["wpb"]) for r in records[1:]) if len(records) > 1 and
               all("wpb" in r for r in records[1:]) else None,
               wps_records=wps, losses=[[int(float(r["num_updates"])), float(r["loss"])] for r in records if "loss" in r])
    if probe.tokens:
        out["real_tokens_per_step"] = statistics.median(t[0] for t in probe.tokens)
        out["padded_tokens_per_step"] = statistics.median(t[1] for t in probe.tokens)
        out["batch_fill"] = round(statistics.median(t[2] for t in probe.tokens) / row["max_tokens"], 3)
        out["sentences_per_step"] = statistics.median(t[3] for t in probe.tokens)
    if probe.flops is not None and probe.flops_tokens:
        out["flops_per_token"] = probe.flops / probe.flops_tokens
    if probe.gaps:  # where a GPU row's idle time goes: waiting for batches, or the host's part of the update
        out["between_updates_ms"] = round(1000 * statistics.median(probe.gaps), 2)
        out["train_step_ms"] = round(1000 * statistics.median(probe.inside), 2)
    out["peak_mib"] = peak_mib
    if busy.available and len(records) > 1:  # per measured log interval, as words/s: the median of the same spans
        out["gpu_busy_intervals"], out["gpu_busy"] = busy.of_intervals([r["logged_at"] for r in records])
    else:
        out["gpu_busy"] = None
    if probe.retries:
        out["amp_retries"] = probe.retries
    if probe.kernels:
        out["kernels"] = probe.kernels
    if after is not None:
        out["compile_s_in_row"] = round(after["seconds"] - before["seconds"], 1)
        out["compiled_graphs_in_row"] = after["graphs"] - before["graphs"]
        out["compile_cache_in_row"] = cache_difference(before.get("cache"), after.get("cache"))
        out["eager_fallbacks"] = after["fallbacks"][len(before["fallbacks"]):]
    if after is not None and "--compile-cudagraphs" in row["argv"]:
        # per layer class: batch shapes recorded as CUDA graphs in this process, calls beyond the cap (none on a CPU)
        out["cudagraph_shapes"] = {name: dict(recorded=recorded, beyond_cap=beyond)
                                   for name, (recorded, beyond) in after["graph_shapes"].items()}
    if out["updates"] < max_update(row["argv"]):
        out["error"] = f"stopped at update {out['updates']} of {max_update(row['argv'])}"
    return out


def max_update(argv):
    return int(argv[argv.index("--max-update") + 1])


def child(plan_path, record_path, deadline):
    """Run the plan's rows in this process, one after another, adding each to the record as it finishes."""
    with open(plan_path) as f:
        spec = json.load(f)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                        stream=sys.stdout)
    if not spec["stock"]:
        import umst_plugin  # noqa: F401  (fairseq's --user-dir import finds it loaded)
        from umst_dev import op_counts  # noqa: F401  (FLOP formulas torch lacks: addbmm)
    import torch

    busy = GpuBusy(_visible_index(), enabled=torch.cuda.is_available())
    try:
        for row in spec["rows"]:
            label = row_label(row)
            if deadline and time.time() > deadline - MIN_ROW_SECONDS:
                print(f"[speed] {label}: not run (deadline)", flush=True)
                update_record(record_path, dict(row, error="not run (deadline)"))
                continue
            if "--fp16" in row["argv"] and not torch.cuda.is_available():
                update_record(record_path, dict(row, error="skipped: fairseq's --fp16 (FP16Optimizer) needs CUDA"))
                continue
            print(f"[speed] {label}: fairseq-train {shlex.join(row['argv'][1:3])} ...", flush=True)
            try:
                result = run_row(row, spec["measured_from"], busy)
            except Exception as e:  # noqa: BLE001  (a failed row is recorded; the others run)
                result = dict(row, error=f"{type(e).__name__}: {str(e)[:500]}")
            update_record(record_path, result)
            print(f"[speed] {label}: " + (f"{result['words_per_s']:,.0f} words/s" if result.get("words_per_s")
                                          else result.get("error", "no records")), flush=True)
    finally:
        busy.close()
    return 0


def _visible_index():
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return first if first else "0"


def row_label(row):
    return (f"{row['name']} {row['precision']}{' compiled' if row['compiled'] else ''} "
            f"{row['max_tokens']:,} tokens")


def row_key(row):
    return (row["name"], row["precision"], row["compiled"], row["max_tokens"])


def warm_up_key(row):
    """A compiled row's key in the record's ``warm_up`` (and in an earlier record's compile seconds): "name tokens"."""
    return f"{row['name']} {row['max_tokens']}"


# ---- the record ---------------------------------------------------------------------------------------------------

def update_record(path, row):
    """Put ``row`` into the record at ``path`` (replacing the row of the same key), recompute what depends on the
    rows (:func:`finish`) and write it again (atomically), with its markdown beside it."""
    with open(path) as f:
        record = json.load(f)
    record["rows"] = [r for r in record["rows"] if row_key(r) != row_key(row)] + [row]
    write_record(path, finish(record))


def write_record(path, record):
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(markdown(record) + "\n")


def peak_flops(card):
    for fragment, peak in DENSE_BF16_PEAK:
        if card and fragment in card:
            return peak
    return None


def finish(record):
    """Fill what derives from several rows: a compiled row's FLOPs per token from its eager row; MFU; words/s per
    FLOP against the plugin transformer's (same compile state and batch); each compiled row's loss check; the
    targets. Rows keep the plan's order."""
    order = {row_key(r): i for i, r in enumerate(record.get("plan", []))}
    rows = sorted(record["rows"], key=lambda r: order.get(row_key(r), len(order)))
    record["rows"] = rows
    by = {row_key(r): r for r in rows}
    peak = peak_flops(record.get("card"))
    for r in rows:
        if r["compiled"] and r.get("flops_per_token") is None:
            eager = by.get((r.get("variant_of", r["name"]), r["precision"], False, r["max_tokens"]))
            if eager and eager.get("flops_per_token"):
                r["flops_per_token"] = eager["flops_per_token"]
        if r.get("words_per_s") and r.get("flops_per_token"):
            r["mfu"] = round(r["words_per_s"] * r["flops_per_token"] / peak, 4) if peak else None
        else:
            r.setdefault("mfu", None)
        if r["stock"] and r.get("flops_per_token") is None:
            plugin = by.get(("transformer", "bf16", False, r["max_tokens"]))
            if plugin and plugin.get("flops_per_token") and r.get("words_per_s"):
                r["flops_per_token"] = plugin["flops_per_token"]
                r["mfu"] = round(r["words_per_s"] * r["flops_per_token"] / peak, 4) if peak else None
        warm = record.get("warm_up", {}).get(warm_up_key(r), {})
        if r["compiled"] and warm.get("seconds") is not None:
            r["compile_s"] = warm["seconds"]  # the cold compile, by the warm-up the record keeps
        r.setdefault("compile_s", None)
    for r in rows:
        base = by.get(("transformer", r["precision"], r["compiled"], r["max_tokens"]))
        if base and not r["stock"] and base.get("words_per_s") and r.get("words_per_s") and \
                r.get("flops_per_token") and base.get("flops_per_token"):
            r["words_per_flop_vs_transformer"] = round(
                r["words_per_s"] * r["flops_per_token"] / (base["words_per_s"] * base["flops_per_token"]), 3)
        k = r.get("kernels")
        if k and k.get("kernel_ms") and r.get("flops_per_token") and peak:
            # the profiled update's FLOPs over its kernel time alone: how well the kernels use the card, the host
            # apart (words/s's MFU counts the host's waits too)
            k["kernel_mfu"] = round(r["flops_per_token"] * k["target_tokens"] / (k["kernel_ms"] / 1000) / peak, 4)
        own = by.get((r.get("shape_baseline"), r["precision"], r["compiled"], r["max_tokens"]))
        if own and own.get("words_per_s") and r.get("words_per_s") and r.get("flops_per_token") and \
                own.get("flops_per_token"):
            r["words_per_flop_vs_own_shape"] = round(
                r["words_per_s"] * r["flops_per_token"] / (own["words_per_s"] * own["flops_per_token"]), 3)
        stock = by.get(("stock transformer", "fp16", False, r["max_tokens"]))
        if stock and stock.get("words_per_s") and r.get("words_per_s"):
            r["vs_stock_fp16"] = round(r["words_per_s"] / stock["words_per_s"], 3)
        if r["compiled"]:
            r["loss_check"] = loss_check(r, by, record.get("warm_up", {}))
    record["targets"] = targets(record, by)
    return record


def max_loss_gap(a_points, b_points):
    """The largest difference between two runs' losses at the logged updates both reached, or None."""
    a, b = dict(map(tuple, a_points or [])), dict(map(tuple, b_points or []))
    common = set(a) & set(b)
    return max(abs(a[u] - b[u]) for u in common) if common else None


def loss_check(row, by, warm_up):
    """Whether a compiled row's losses equal its eager row's within noise. Compiled and eager code draw dropout
    masks from different random streams (inductor's own) and round differently (fused intermediates stay fp32),
    so the noise is measured, not assumed: ``dropout`` is this compiled row's own gap to its warm-up run, the same
    run with other dropout masks (:func:`warm_up_child`); ``precision`` is the plugin transformer's gap between
    bf16 and fp32 (tf32) at this batch, the same masks (0 against a ``loss_reference`` row, compiled in the same
    precision: ``--cudagraphs``); the tolerance is :data:`LOSS_NOISE_MARGIN` times their sum, at least the log's
    resolution."""
    if row.get("variant_of") and not row.get("loss_reference"):
        return dict(ok=None, why="bucketed batches: no eager row trained the same batches")
    reference = by.get((row["loss_reference"], row["precision"], True, row["max_tokens"]) if row.get("loss_reference")
                       else (row["name"], row["precision"], False, row["max_tokens"]))
    diff = max_loss_gap(reference.get("losses") if reference else None, row.get("losses"))
    if diff is None:
        return dict(ok=None, why=f"no {row.get('loss_reference') or 'eager'} row's losses to compare with")
    dropout = max_loss_gap(row.get("losses"), warm_up.get(warm_up_key(row), {}).get(
        "losses_dropout_shifted"))
    precision = 0.0 if row.get("loss_reference") else max_loss_gap(  # a reference row of the same precision: none
        *(by.get(("transformer", p, False, row["max_tokens"]), {}).get("losses") for p in ("bf16", "tf32")))
    if dropout is None or precision is None:
        return dict(ok=None, max_abs_diff=round(diff, 4),
                    why="noise not measured (" + ", ".join(
                        w for w, v in (("no warm-up losses", dropout), ("no transformer bf16 / tf32 rows", precision))
                        if v is None) + ")")
    tolerance = max(LOSS_NOISE_MARGIN * (dropout + precision), 2 * LOSS_RESOLUTION)
    return dict(ok=diff <= tolerance, max_abs_diff=round(diff, 4), tolerance=round(tolerance, 4),
                dropout_noise=round(dropout, 4), precision_noise=round(precision, 4))


def targets(record, by):
    """The targets at the recipe batch (the first in the plan): each with its figure and whether it is met (None
    where no row it needs was measured). A target over several rows is taken over the rows measured, and names the
    rest in ``missing``."""
    tokens = record.get("max_tokens", [RECIPE_MAX_TOKENS])[0]
    out = {}
    stock = by.get(("stock transformer", "fp16", False, tokens), {}).get("words_per_s")
    tf = by.get(("transformer", "bf16", True, tokens), {})
    tf_eager = by.get(("transformer", "bf16", False, tokens), {})
    tf32 = by.get(("transformer", "tf32", False, tokens), {}).get("words_per_s")

    def target(name, value, bound):  # every target is a least value
        met = None if value is None else value >= bound
        out[name] = dict(value=None if value is None else round(value, 3), target=bound, met=met)
    target("transformer_vs_stock_fp16", tf.get("words_per_s") / stock if stock and tf.get("words_per_s") else None,
           TARGETS["transformer_vs_stock_fp16"])
    target("transformer_mfu", tf.get("mfu"), TARGETS["transformer_mfu"])
    # over the rows measured: a row not run (deadline, error) is named in "missing", not taken as failing
    def over_rows(name, rows, field, bound):
        values = [(r["name"] + (" compiled" if r["compiled"] else ""), r.get(field)) for r in rows]
        present = [v for _, v in values if v is not None]
        target(name, min(present) if present else None, bound)
        out[name].update(rows=len(present), missing=[n for n, v in values if v is None])
    plugin_rows = [r for r in by.values() if not r["stock"] and not r.get("baseline_row") and not r.get("variant_of")
                   and r["max_tokens"] == tokens]
    over_rows("words_per_flop_vs_transformer (worst compiled)",
              [r for r in plugin_rows if r["compiled"] and r["name"] != "transformer"],
              "words_per_flop_vs_transformer", TARGETS["words_per_flop_vs_transformer"])
    over_rows("gpu_busy (least plugin row)", plugin_rows, "gpu_busy", TARGETS["gpu_busy"])
    target("bf16_vs_tf32", tf_eager.get("words_per_s") / tf32 if tf32 and tf_eager.get("words_per_s") else None,
           TARGETS["bf16_vs_tf32"])
    compiled = [r for r in plugin_rows if r["compiled"]]
    checks = [r.get("loss_check", {}).get("ok") for r in compiled if r.get("words_per_s")]
    out["compiled_losses_equal_eager"] = dict(
        met=False if False in checks else (True if checks and None not in checks else None),
        rows=len(checks), compared=sum(c is not None for c in checks),
        missing=[r["name"] + " compiled" for r in compiled if not r.get("words_per_s")])
    return out


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


SPEED_HEAD = ["row", "precision", "compiled", "words/s", "vs stock --fp16", "tokens/step real / padded",
              "MFLOP/token", "MFU", "words/s per FLOP vs transformer", "vs own shape", "GPU busy",
              "host ms between / in updates", "peak MiB", "compile s", "losses"]


def table_markdown(record, which):
    """One table of the record, as its markdown lines: the rows at ``which`` tokens, or the targets
    (``which="targets"``). docs/performance.md renders both from the record (``compare_runs table --kind speed``)."""
    if str(which) == "targets":
        lines = ["| target | value | bound | met |", "|---|---|---|---|"]
        for name, t in record.get("targets", {}).items():
            value = (_fmt(t.get("value"), ".3f") if "value" in t
                     else f"{t.get('compared', t.get('rows'))} of {t.get('rows')} compared")
            if t.get("missing"):
                value += f" ({t['rows']} rows; not measured: {', '.join(t['missing'])})"
            lines.append(f"| {name} | {value} | {t.get('target', '-')} | {t.get('met')} |")
        return lines
    lines = ["| " + " | ".join(SPEED_HEAD) + " |", "|" + "|".join("---" for _ in SPEED_HEAD) + "|"]
    for r in record["rows"]:
        if r["max_tokens"] != int(which):
            continue
        if not r.get("words_per_s"):
            lines.append(f"| {r['name']} | {r['precision']} | {'yes' if r['compiled'] else 'no'} | "
                         f"{r.get('error', 'no result')} |" + " |" * (len(SPEED_HEAD) - 4))
            continue
        check = r.get("loss_check") or {}
        same = "= " + (r.get("loss_reference") or "eager")
        losses = "-" if not r["compiled"] else {True: same, False: "**differ**", None: "not compared"}[check.get("ok")]
        lines.append(
            f"| {r['name']} | {r['precision']} | {'yes' if r['compiled'] else 'no'} | {r['words_per_s']:,.0f} | "
            f"{_fmt(r.get('vs_stock_fp16'), '.2f')} | "
            f"{_fmt(r.get('real_tokens_per_step'), ',.0f')} / {_fmt(r.get('padded_tokens_per_step'), ',.0f')} | "
            f"{_fmt(r['flops_per_token'] / 1e6 if r.get('flops_per_token') else None, '.4g')} | "
            f"{_fmt(r.get('mfu'), '.3f')} | {_fmt(r.get('words_per_flop_vs_transformer'), '.2f')} | "
            f"{_fmt(r.get('words_per_flop_vs_own_shape'), '.2f')} | "
            f"{_fmt(r.get('gpu_busy'), '.2f')} | "
            f"{_fmt(r.get('between_updates_ms'), '.1f')} / {_fmt(r.get('train_step_ms'), '.1f')} | "
            f"{_fmt(r.get('peak_mib'), ',')} | "
            f"{_fmt(r.get('compile_s'), '.0f')} | {losses} |")
    return lines


KERNEL_COLUMNS = ("matmul", "attention", "convolution", "fused (inductor)", "softmax and loss", "layer norm",
                  "dropout", "copy and cast", "elementwise", "reduction", "optimizer", "communication", "other")


def kernel_markdown(record, tokens):
    """The profiled update of each row at ``tokens`` that has one: kernels, kernel time, kernel-time MFU and the
    share of kernel time by category (:data:`benchmarks.common.KERNEL_CATEGORIES`)."""
    rows = [r for r in record["rows"] if r["max_tokens"] == int(tokens) and r.get("kernels")]
    if not rows:
        return []
    head = ["row", "compiled", "kernels", "kernel ms", "kernel MFU"] + [f"{c} %" for c in KERNEL_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        k = r["kernels"]
        shares = [100 * k["by_category"].get(c, 0.0) / k["kernel_ms"] if k["kernel_ms"] else None
                  for c in KERNEL_COLUMNS]
        lines.append(f"| {r['name']} {r['precision']} | {'yes' if r['compiled'] else 'no'} | {k['kernels']:,} | "
                     f"{k['kernel_ms']:.1f} | {_fmt(k.get('kernel_mfu'), '.3f')} | "
                     + " | ".join(_fmt(v, '.0f') for v in shares) + " |")
    return lines


def markdown(record):
    where = record.get("card") or f"CPU ({record.get('cpu')})"
    lines = [f"# fairseq-train speed: {where}", "",
             f"Commit {record.get('commit')}, torch {record.get('torch')}; corpus: {record.get('corpus', {}).get('what')}; "
             f"{record.get('updates')} updates per row, log interval {record.get('log_interval')} "
             f"(`{record.get('command')}`).", ""]
    if len(record.get("calls", [])) > 1:
        lines += [f"Measured in {len(record['calls'])} calls (the same plan; each call after the first ran the rows "
                  "not yet done): " + "; ".join(f"`{c['command']}` at {c['started']}" for c in record["calls"]) + ".",
                  ""]
    lines += [f"Note: {n}" for n in record.get("notes", [])] + ([""] if record.get("notes") else [])
    for tokens in record.get("max_tokens", []):
        lines += [f"## --max-tokens {tokens:,}", ""] + table_markdown(record, tokens) + [""]
        kernels = kernel_markdown(record, tokens)
        if kernels:
            lines += [f"Kernel time of update {PROFILE_UPDATE + 1} (profiled, in the dropped first interval), by "
                      "what the kernels' names say:", ""] + kernels + [""]
    in_rows = in_row_compiling(record)
    if in_rows:
        lines += ["Compiling inside the measured rows, after the warm-ups filled the shared cache (seconds; torch's "
                  "FX graph and AOTAutograd cache hits / misses: a miss is a graph the warm-up did not make):", ""]
        lines += [f"* {line}" for line in in_rows] + [""]
    lines += ["## Targets (recipe batch)", ""] + table_markdown(record, "targets")
    return "\n".join(lines)


def in_row_compiling(record):
    """One line per compiled row that compiled inside its measured run: its seconds and cache counts."""
    lines = []
    for r in record["rows"]:
        if not r["compiled"] or r.get("compile_s_in_row") is None:
            continue
        line = f"{r['name']} {r['max_tokens']:,}: {r['compile_s_in_row']:.1f} s"
        cache = r.get("compile_cache_in_row")
        if cache:
            line += (f"; FX graph {cache['fxgraph_cache_hit']} / {cache['fxgraph_cache_miss']}, "
                     f"AOTAutograd {cache['autograd_cache_hit']} / {cache['autograd_cache_miss']}")
        lines.append(line)
    return lines


# ---- the parent: data, compile warm-up, the two processes ---------------------------------------------------------

def git_commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def slug(name):
    import re

    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def process_env(extra_paths=()):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([*extra_paths, ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def corpus_stamp(sizes):
    """What a built corpus is checked against before it is used again: its arguments and a digest of the code that
    writes it (``synthetic_corpus.py``), so a corpus built by other code is built again."""
    with open(importlib.util.find_spec("benchmarks.synthetic_corpus").origin, "rb") as f:
        code = hashlib.sha256(f.read()).hexdigest()[:16]
    return dict(sizes, code=code)


def build_corpus(directory, sizes, log, env):
    """The synthetic corpus (synthetic_corpus.py) in ``directory``, built by a process of its own unless a
    previous call, or ``--corpus-only`` on another machine (its ``data-bin`` and stamp carried here), built the same
    one (:func:`corpus_stamp`, recorded beside it). The corpus is deterministic: the same arguments and code write
    the same files on any machine."""
    stamp, wanted = os.path.join(directory, CORPUS_STAMP), corpus_stamp(sizes)
    databin = os.path.join(directory, "data-bin")
    if os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == wanted and os.path.exists(os.path.join(databin, "dict.src.txt")):
                return databin, 0.0
    start = time.time()
    argv = [sys.executable, "-m", "benchmarks.synthetic_corpus", directory,
            "--train", str(sizes["train"]), "--valid", str(sizes["valid"]), "--test", str(sizes["test"]),
            "--vocab", str(sizes["vocab"]), "--lengths", sizes["lengths"], "--workers", str(min(8, os.cpu_count() or 1))]
    log.write("$ " + shlex.join(argv) + "\n")
    log.flush()
    subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=True)
    with open(stamp, "w") as f:
        json.dump(wanted, f)
    return databin, time.time() - start


def prepare_corpus(work, sizes, env):
    """:func:`build_corpus` in ``work``/corpus, logged to ``work``/parent-log.txt, its line printed; its data-bin."""
    with open(os.path.join(work, "parent-log.txt"), "a") as log:
        databin, seconds = build_corpus(os.path.join(work, "corpus"), sizes, log, env)
    print(f"[speed] corpus {databin}: " + ("built in %.0f s" % seconds if seconds else
                                           "built before (its stamp matches)"), flush=True)
    return databin


def warm_up_slots(rows, card_gib):
    """How many warm-ups run at once: as many as the card's memory holds at :data:`WARM_UP_GIB_PER_KTOKEN` each
    (every one where there is no card: a CPU)."""
    if not rows or not card_gib:
        return max(1, len(rows))
    per_row = WARM_UP_GIB_PER_KTOKEN * max(r["max_tokens"] for r in rows) / 1000
    return max(1, min(len(rows), int(0.95 * card_gib // per_row)))


def compile_seconds_known(*folders):
    """{"name tokens": cold compile seconds} from the speed records in ``folders`` (a warm-up that did not finish
    counts as the longest): the warm-ups' order, longest first, so that the last to start is a short one. The call
    reads its ``--out`` and the committed records (:data:`RESULTS`), so that a fresh checkout, whose ``--out`` holds
    none, still starts with the longest."""
    import glob

    known = {}
    paths = {os.path.realpath(p) for folder in folders for p in glob.glob(os.path.join(folder, "gpu-speed-*.json"))}
    for path in sorted(paths):
        record = read_record(path)
        arch_of = {r.get("name"): r.get("arch") for r in record.get("rows", []) if r.get("arch")}
        for key, w in record.get("warm_up", {}).items():
            seconds = w.get("seconds") or float("inf")
            known[key] = max(known.get(key, 0.0), seconds)
            name, _, tokens = key.rpartition(" ")
            if arch_of.get(name):  # the arch's layers compile the same classes whatever row trains them
                by_arch = f"arch {arch_of[name]} {tokens}"
                known[by_arch] = max(known.get(by_arch, 0.0), seconds)
    return known


def warm_up_order(rows, known):
    """The rows by their known compile seconds, longest first; a row not known by name by its arch's (another row
    of the same arch, at another shape: the same layer classes to compile), else last, in the plan's order."""
    def seconds(r):
        return known.get(warm_up_key(r), known.get(f"arch {r.get('arch')} {r['max_tokens']}", 0.0))
    return sorted(rows, key=lambda r: -seconds(r))


WARM_UP_COMMAND = (sys.executable, "-m", "benchmarks.speed_table")  # a warm-up's process: warm_up_child


def warm_up(rows, work, env, timeout, card_gib=None, order=None, child_command=None):
    """Compile every compiled row once, each in a process of its own that trains the row (:func:`warm_up_child`)
    into the shared inductor cache (``env``'s TORCHINDUCTOR_CACHE_DIR), as many at once as :func:`warm_up_slots`
    gives, the longest compiles first (``order``: :func:`compile_seconds_known`): {"name tokens": dict(seconds of
    compiling, graphs, losses with other dropout masks, error)}. Processes still running at ``timeout`` are stopped,
    and those not started by then are not (their rows compile the rest when they run). ``child_command``: the
    program a warm-up runs, given ``--warm-up-row SPEC --warm-up-out OUT`` (default: this module's
    :func:`warm_up_child`; the scheduling's tests give one that sleeps)."""
    if not rows:
        return {}
    pending = warm_up_order(rows, order or {})
    slots = warm_up_slots(rows, card_gib)
    threads = max(1, (os.cpu_count() or 2) // slots)
    concurrent = "all compiled rows at once" if slots >= len(rows) else f"{slots} compiled rows at a time"
    end = time.time() + timeout
    running, results = [], {}

    def start(row):
        key = warm_up_key(row)
        out = os.path.join(work, f"warm-up-{slug(key)}.json")
        spec = os.path.join(work, f"warm-up-{slug(key)}-row.json")
        if os.path.exists(out):  # an earlier call's result: a warm-up stopped at the cap must not report it
            os.remove(out)
        with open(spec, "w") as f:
            json.dump(row, f)
        log = open(os.path.join(work, f"warm-up-{slug(key)}-log.txt"), "w")
        proc_env = dict(env, TORCHINDUCTOR_COMPILE_THREADS=str(threads))
        if card_gib:
            proc_env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        running.append((key, out, log, subprocess.Popen(
            list(child_command or WARM_UP_COMMAND) + ["--warm-up-row", spec, "--warm-up-out", out],
            stdout=log, stderr=subprocess.STDOUT, env=proc_env, cwd=ROOT, start_new_session=True), time.time()))

    def collect(key, out, log, proc, started, capped=False):
        log.close()
        try:
            with open(out) as f:
                results[key] = dict(json.load(f), concurrent=concurrent)
        except (OSError, ValueError):
            results[key] = dict(seconds=None, error=f"no result (rc {proc.returncode}; see {log.name})",
                                compile_log=compile_log(log.name))
            if capped:  # still running (compiling, mostly): where it was, from the stack it wrote at the cap
                # the cap counts from the first warm-up's start: one started in a later wave had less of it
                stack, ran = stack_at_cap(log.name), round(end - started, 1)
                results[key].update(error=f"stopped at the warm-up cap ({timeout:.0f} s; it had run {ran:.0f} s), "
                                    "still running" + (f" in {stack['where']}" if stack else "") + f"; see {log.name}",
                                    stack_at_cap=stack, ran_s=ran)
        print(f"[speed] compile warm-up {key}: " + (f"{results[key]['seconds']:.0f} s of compiling"
                                                    if results[key].get("seconds") is not None
                                                    else results[key]["error"]), flush=True)

    while pending or running:
        while pending and len(running) < slots and time.time() < end:
            start(pending.pop(0))
        if not running:
            break
        for item in list(running):
            if item[3].poll() is not None:
                running.remove(item)
                collect(*item)
        if time.time() >= end:
            stopped = [item for item in running if item[3].poll() is None]
            for item in stopped:
                _ask_stack(item[3])
            wait_for_stacks([item[2].name for item in stopped])
            for item in running:
                _kill_group(item[3])
                collect(*item, capped=item in stopped)
            running = []
        else:
            time.sleep(0.5)
    for row in pending:
        key = warm_up_key(row)
        results[key] = dict(seconds=None, error="not started (warm-up timeout)")
        print(f"[speed] compile warm-up {key}: not started (timeout)", flush=True)
    return results


def warm_up_child(spec_path, out_path):
    """A compile warm-up: the compiled row's whole run with its dropout masks shifted (:data:`DROPOUT_SHIFT`): the
    seconds of compiling, and the losses that tell how much dropout alone moves them (the loss check's noise)."""
    with open(spec_path) as f:
        row = json.load(f)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    # where the compile is when the warm-up cap stops it (warm_up sends STACK_SIGNAL first): a C-level handler, so
    # it answers while the main thread waits in a compiler
    faulthandler.register(STACK_SIGNAL, file=sys.stdout, all_threads=True)
    print(f"{MAIN_THREAD_LINE} 0x{threading.get_ident():016x}", flush=True)  # which of the dumped stacks is ours
    import umst_plugin  # noqa: F401
    import torch

    before = _compile_state()
    start = time.time()
    result = {}
    peak = PeakMemory(torch.cuda.is_available())
    try:
        with peak:
            records, _ = train(row["argv"], StepProbe(measured_from=10 ** 9, count_flops=False, pad_index=1),
                               dropout_shift=DROPOUT_SHIFT)
        result["losses_dropout_shifted"] = [[int(float(r["num_updates"])), float(r["loss"])] for r in records
                                            if "loss" in r]
    except Exception as e:  # noqa: BLE001
        result["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    after = _compile_state()
    result.update(seconds=round(after["seconds"] - before["seconds"], 1), wall_s=round(time.time() - start, 1),
                  graphs=after["graphs"] - before["graphs"], eager_fallbacks=after["fallbacks"],
                  compile_cache=cache_difference(before["cache"], after["cache"]))
    if torch.cuda.is_available():
        result["peak_mib"] = peak.mib
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


def wait_for_stacks(logs, limit=STACK_WAIT_S, poll=0.25):
    """Return once every log holds its training thread's stack (:func:`stack_at_cap`) and has not grown since the
    last look (faulthandler writes every thread's stack, one after another), or after ``limit`` seconds."""
    end, sizes = time.time() + limit, {}
    while logs and time.time() < end:
        grown = {path: os.path.getsize(path) if os.path.exists(path) else 0 for path in logs}
        if grown == sizes and all(stack_at_cap(path) is not None for path in logs):
            return True
        sizes = grown
        time.sleep(poll)
    return not logs


def _ask_stack(proc):
    """Ask a warm-up for its threads' stacks (:data:`STACK_SIGNAL`; its process only, not the compile workers)."""
    try:
        os.kill(proc.pid, STACK_SIGNAL)
    except ProcessLookupError:
        pass


COMPILE_PHASES = (("torch/fx/experimental/symbolic_shapes.py", "symbolic shapes"), ("sympy/", "symbolic shapes"),
                  ("torch/_inductor/", "inductor"), ("torch/_functorch/", "AOTAutograd"), ("torch/_dynamo/", "dynamo"),
                  ("triton/", "Triton"))
# frames in a compiler's files that every phase passes through, so they name none: dynamo's disable wrapper (around
# every decomposition and fake-tensor call, AOTAutograd's included) and the FX interpreter's node runner (the H200's
# warm-up of the transformer of Prime's shape was reported "in dynamo" while AOTAutograd traced its joint graph)
PASS_THROUGH_FRAMES = (("torch/_dynamo/eval_frame.py", "_fn"), ("torch/fx/experimental/symbolic_shapes.py", "run_node"))
COMPILE_LOG_LINES = 20  # the plugin's last "--compile:" lines a warm-up that did not finish keeps in the record


def compile_log(log_path, limit=COMPILE_LOG_LINES):
    """The plugin's ``--compile:`` lines in a warm-up's log (each layer compiled, its seconds and graphs), from
    ``--compile:`` on, the last ``limit``: how far a warm-up that did not finish had got, in the record that a GPU
    call brings back (its log stays on the machine)."""
    try:
        with open(log_path, errors="replace") as f:
            lines = [line.rstrip("\n") for line in f if "--compile:" in line]
    except OSError:
        return []
    return [line[line.index("--compile:"):] for line in lines][-limit:]


def stack_at_cap(log_path):
    """The training thread's stack in a warm-up's log (:data:`MAIN_THREAD_LINE` names it), as faulthandler wrote
    it at the cap (the last dump), or None when the log holds none: ``thread``, its id; ``frames``, innermost
    first, ``path:line in function`` (paths from ``site-packages/`` or the checkout); ``layer``, the innermost
    frame of the plugin's own code outside ``compilation/`` (whose layers were compiling); ``phase``, the compiler
    part of the innermost frame that names one (:data:`COMPILE_PHASES`; not the :data:`PASS_THROUGH_FRAMES`);
    ``where``, the innermost frame, the phase and the layer."""
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    # the training thread's (the others: compile workers); faulthandler keeps a stack's innermost 100 frames
    ident = re.findall(re.escape(MAIN_THREAD_LINE) + r" (0x[0-9a-f]+)", text)
    # a frame per line; a signal that came during a garbage collection puts "  Garbage-collecting" first
    main = ident and re.findall(r"(?:Current thread|Thread) " + ident[-1]
                                + r" \(most recent call first\):\n((?:  (?:File .*|Garbage-collecting)\n)+)", text)
    if not main:
        return None
    frames = []
    for m in re.finditer(r'  File "([^"]+)", line (\d+) in (\S+)', main[-1]):
        path = m.group(1)
        if "site-packages/" in path:
            path = path.split("site-packages/", 1)[-1]
        elif not os.path.relpath(path, ROOT).startswith(".."):
            path = os.path.relpath(path, ROOT)
        frames.append(f"{path}:{m.group(2)} in {m.group(3)}")
    layer = next((f for f in frames if f.startswith("umst_plugin/") and not f.startswith("umst_plugin/compilation/")),
                 None)
    phase = next((name for f in frames for prefix, name in COMPILE_PHASES if f.startswith(prefix) and not any(
        f.startswith(path + ":") and f.endswith(" in " + function) for path, function in PASS_THROUGH_FRAMES)), None)
    where = ", ".join(frames[:1] + ([phase] if phase else []) + ([f"under {layer}"] if layer else [])) or None
    return dict(thread=ident[-1], frames=frames, layer=layer, phase=phase, where=where)


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_child(rows, tag, work, record_path, env, deadline, measured_from):
    """One process running ``rows`` in order (stock: never imports the plugin); its output to WORK/TAG-log.txt,
    its ``[speed]`` lines also here. Killed at the deadline."""
    if not rows:
        return
    plan_path = os.path.join(work, f"{tag}-plan.json")
    with open(plan_path, "w") as f:
        json.dump(dict(stock=tag == "stock", rows=rows, measured_from=measured_from), f)
    log_path = os.path.join(work, f"{tag}-log.txt")
    with open(log_path, "a") as log:
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.speed_table", "--child", plan_path, "--record",
                                 record_path, "--deadline-at", str(deadline or 0)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT, text=True,
                                errors="replace", start_new_session=True)
        relay = threading.Thread(target=_relay, args=(proc.stdout, log), daemon=True)
        relay.start()
        try:
            proc.wait(timeout=max(1, deadline - time.time()) if deadline else None)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            print(f"[speed] the {tag} process stopped at the deadline; its finished rows are in {record_path}",
                  flush=True)
        relay.join(timeout=5)
        if proc.returncode not in (0, None, -9):
            print(f"[speed] the {tag} process ended with rc {proc.returncode} (see {log_path})", flush=True)


def _relay(stream, log):
    for line in stream:
        log.write(line)
        if line.startswith("[speed]"):
            log.flush()
            print(line, end="", flush=True)
    log.flush()


def read_record(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def warm_up_finished(w):
    """A warm-up that compiled and trained its updates (its losses with other dropout masks are there)."""
    return bool(w.get("losses_dropout_shifted")) and not w.get("error")


def warm_ups_kept(warm_ups, cache_dir):
    """An earlier call's warm-ups that finished, kept where its inductor cache is still here (the same machine):
    their rows load the compiled code from it, and the warm-up's cold compile seconds and losses stand."""
    if not os.path.isdir(cache_dir) or not os.listdir(cache_dir):
        return {}
    return {key: w for key, w in warm_ups.items() if warm_up_finished(w)}


def merge_warm_ups(earlier, fresh):
    """The record's warm-ups after a call: every warm-up an earlier call finished stays (on another machine, whose
    inductor cache is gone, its cold compile seconds and its losses with other dropout masks still stand: the same
    commit, card and plan), and this call's replace them only where they finished too; a warm-up of this call that
    did not finish (stopped at its cap, failed) is kept only where no earlier one finished."""
    merged = {k: w for k, w in earlier.items() if warm_up_finished(w)}
    for key, w in fresh.items():
        if key not in merged or warm_up_finished(w):
            merged[key] = w
    return merged


def rows_done(earlier, plan_rows):
    """Rows of the same plan that an earlier run of the same command finished (no error), from its record
    (:func:`read_record`; empty where there was none)."""
    wanted = {row_key(r): r["argv"] for r in plan_rows}
    return [r for r in earlier.get("rows", []) if wanted.get(row_key(r)) == r.get("argv") and not r.get("error")]


def record_name(card, commit, tiny=False, cudagraphs=None):
    """The record's file name: gpu-speed-<card>-<commit>.json on a card, speed-cpu[-tiny]-<commit>.json on a CPU;
    the CUDA graph plan's (``cudagraphs``) a record of its own beside the table's, speed-cudagraphs-..."""
    name = f"gpu-speed-{slug(card)}" if card else f"speed-cpu{'-tiny' if tiny else ''}"
    if cudagraphs:
        name = name.replace("speed-", "speed-cudagraphs-", 1)
    return f"{name}-{commit}.json"


def resume(record, earlier, plan_rows):
    """Start ``record`` (the call's, its ``started`` this call's start) from ``earlier``, the record the same command
    wrote before (``{}`` where none): the rows of the same plan it finished (:func:`rows_done`), its first call's
    start and a line per call, this one's last. Returns ``earlier``, or ``{}`` where none of its rows is kept
    (another plan's record): its warm-ups are kept only with its rows."""
    record["rows"] = rows_done(earlier, plan_rows)
    if not record["rows"]:
        earlier = {}
    # a call that resumes keeps the first call's start, the warm-ups it made (cold compile seconds, the losses the
    # loss check's dropout noise comes from) and a line per call
    now = record["started"]
    record["started"] = earlier.get("started", now)
    record["calls"] = earlier.get("calls", []) + [dict(started=now, command=record["command"],
                                                       install_s=record.get("install_s"))]
    return earlier


def warm_up_rows(plugin_rows, first_max_tokens, kept):
    """The rows a warm-up compiles: the compiled rows at the first batch size, but those whose warm-up an earlier
    call finished here (``kept``: :func:`warm_ups_kept`). A compiled row at another size compiles in its own run."""
    return [r for r in plugin_rows if r["compiled"] and r["max_tokens"] == first_max_tokens
            and warm_up_key(r) not in kept]


def settings(args, table, work):
    """What the command line asks for, its defaults filled in: the rows' archs and compiled archs (``table``: the
    arch table, :func:`harness.table`; ValueError naming an unknown arch), the batch sizes in order, the updates
    and log interval of a row, and the data-bin."""
    measured = harness.recipe_rows(table)
    arch_list = args.archs if args.archs is not None else CUDAGRAPH_ARCHS if args.cudagraphs else ",".join(measured)
    archs = [a for a in arch_list.split(",") if a]
    compile_default = "transformer" if args.tiny else ",".join(measured)
    compile_archs = [a for a in (args.compile_archs if args.compile_archs is not None else compile_default).split(",")
                     if a]
    unknown = sorted(set(archs + compile_archs) - set(table))
    if unknown:
        raise ValueError(f"unknown arch(s) {', '.join(unknown)}; choices: {', '.join(table)}")
    max_tokens = [int(t) for t in (args.max_tokens or (TINY_MAX_TOKENS if args.tiny else
                                                       f"{RECIPE_MAX_TOKENS},{CONTRAST_MAX_TOKENS}")).split(",")]
    if args.cudagraphs:  # the recipe batch alone (no stock rows: plan's), updates enough that replays outnumber recordings
        max_tokens = max_tokens[:1]
    return argparse.Namespace(
        archs=archs, compile_archs=compile_archs, max_tokens=max_tokens,
        updates=args.updates or (8 if args.tiny else CUDAGRAPH_UPDATES if args.cudagraphs else 24),
        log_interval=args.log_interval or (2 if args.tiny else 4),
        data=args.data or os.path.join(work, "corpus", "data-bin"))


def build_parser():
    """The command line of ``python -m benchmarks speed-table`` (:func:`main`)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=RESULTS, help="where the record goes")
    p.add_argument("--work", default=os.path.join(ROOT, "bench-out", "speed"),
                   help="scratch: the corpus, the inductor cache, the processes' logs")
    p.add_argument("--data", default=None, help="a data-bin to train on instead of the synthetic corpus")
    p.add_argument("--wheelhouse", default=None,
                   help="install fairseq and the plugin's needs from this wheelhouse first (scripts/offline-wheelhouse.sh; "
                        "a lent GPU machine without internet), as the GPU check does")
    p.add_argument("--max-tokens", default=None,
                   help=f"batch sizes per card, in order (default: the recipe's {RECIPE_MAX_TOKENS:,}, then "
                        f"{CONTRAST_MAX_TOKENS:,} for contrast; --tiny: {TINY_MAX_TOKENS})")
    p.add_argument("--updates", type=int, default=None, help="updates per row (default 24; --tiny: 8)")
    p.add_argument("--log-interval", type=int, default=None,
                   help="updates per logged record, the first of which is warm-up (default 4; --tiny: 2)")
    p.add_argument("--archs", default=None, help="comma-separated rows (default: the transformer, every family's "
                                                 "and the WMT recipes' shapes; python -m benchmarks.harness lists "
                                                 "them)")
    p.add_argument("--compile-archs", default=None, help="archs with a --compile row (default: all; --tiny: transformer)")
    p.add_argument("--no-stock", action="store_true")
    p.add_argument("--cudagraphs", type=int, nargs="?", const=CUDAGRAPH_BUCKETS, default=None, metavar="BUCKETS",
                   help="the CUDA graph plan instead of the table (docs/compile.md): per arch of --archs (default "
                        f"{CUDAGRAPH_ARCHS}), bf16 eager, --compile on --num-batch-buckets BUCKETS (default "
                        f"{CUDAGRAPH_BUCKETS}) and the same with --compile-cudagraphs, at the first --max-tokens; "
                        f"{CUDAGRAPH_UPDATES} updates a row unless --updates; no stock rows; its own record "
                        "(gpu-speed-cudagraphs-<card>-<commit>.json)")
    p.add_argument("--deadline", type=float, default=None, help="seconds for the whole call")
    p.add_argument("--warm-up-timeout", type=float, default=240, help="seconds for the compile warm-up")
    p.add_argument("--commit", default=None, help="the commit measured (default: git's HEAD of this checkout)")
    p.add_argument("--tiny", action="store_true", help="tiny widths, corpus and batches (a CPU check of the plan)")
    p.add_argument("--dry-run", action="store_true", help="print the plan")
    p.add_argument("--corpus-only", action="store_true",
                   help="build the synthetic corpus in --work and stop: carried to a lent GPU with its stamp, it "
                        "spares the call its building (43 s on the H200 of af33e1d)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--record", help=argparse.SUPPRESS)
    p.add_argument("--deadline-at", type=float, default=0, help=argparse.SUPPRESS)
    p.add_argument("--warm-up-row", help=argparse.SUPPRESS)
    p.add_argument("--warm-up-out", help=argparse.SUPPRESS)
    return p


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.record, args.deadline_at or None)
    if args.warm_up_row:
        return warm_up_child(args.warm_up_row, args.warm_up_out)
    start = time.time()
    deadline = start + args.deadline if args.deadline else None
    work = os.path.abspath(args.work)
    paths, install_s = [], None
    if args.wheelhouse and not args.dry_run:  # this Python has no fairseq: the children get the one installed here
        from benchmarks import gpu_check

        os.makedirs(work, exist_ok=True)
        with open(os.path.join(work, "install-log.txt"), "a") as log:
            site, tree = gpu_check.install(sys.executable, os.path.abspath(args.wheelhouse), work, log)
        paths, install_s = [site, tree], round(time.time() - start, 1)
        print(f"[speed] installed from {args.wheelhouse} in {install_s:.0f} s", flush=True)
    env = process_env(paths)
    sizes = TINY_CORPUS if args.tiny else CORPUS
    if args.corpus_only:  # before the arch table: nothing of the plan is needed
        os.makedirs(work, exist_ok=True)
        databin = prepare_corpus(work, sizes, env)
        print("[speed] carry these to the GPU machine: " + " ".join(
            os.path.relpath(p, ROOT) for p in (databin, os.path.join(work, "corpus", CORPUS_STAMP))), flush=True)
        return 0
    # the arch table is the plugin's registry: read where fairseq imports (a child, after an install)
    rows = harness.table_from_child(env) if paths else harness.table()
    try:
        how = settings(args, rows, work)
    except ValueError as e:
        p.error(str(e))
    stock, plugin = plan(how.data, how.max_tokens, how.updates, how.log_interval, how.archs, how.compile_archs,
                         args.tiny, rows, cudagraph_buckets=args.cudagraphs)
    if args.no_stock:
        stock = []
    if args.dry_run:
        for row in stock + plugin:
            print(f"{row_label(row):>48}: fairseq-train {shlex.join(row['argv'])}")
        return 0
    os.makedirs(work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(work, "inductor-cache")  # shared by the warm-up and the rows
    env.setdefault("OMP_NUM_THREADS", "1" if args.tiny else "4")
    import torch

    info = device_info()
    commit = args.commit or git_commit()
    record_path = os.path.join(args.out, record_name(info["card"], commit, args.tiny, args.cudagraphs))
    command = "python -m benchmarks speed-table " + shlex.join(sys.argv[1:] if argv is None else argv)
    now = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    record = dict(commit=commit, **info, command=command.strip(), max_tokens=how.max_tokens, updates=how.updates,
                  log_interval=how.log_interval, started=now, install_s=install_s,
                  plan=[{k: r[k] for k in ("name", "precision", "compiled", "max_tokens")} for r in stock + plugin])
    earlier = resume(record, read_record(record_path), stock + plugin)
    done = {row_key(r) for r in record["rows"]}
    if done:
        print(f"[speed] {len(done)} rows kept from {record_path} (the same plan); running the rest", flush=True)
    stock = [r for r in stock if row_key(r) not in done]
    plugin = [r for r in plugin if row_key(r) not in done]
    if not args.data:
        prepare_corpus(work, sizes, env)
    from benchmarks.synthetic_corpus import WMT14_MEAN

    record["corpus"] = dict(sizes, what=(f"synthetic, {sizes['train']:,} training pairs of WMT14 En-De's BPE lengths "
                                         f"(log-normal, mean {WMT14_MEAN:.0f} source tokens, tail to 250), "
                                         f"{sizes['vocab']:,}-entry joined dictionary") if not args.data else args.data)
    write_record(record_path, finish(record))
    kept = warm_ups_kept(earlier.get("warm_up", {}), env["TORCHINDUCTOR_CACHE_DIR"])
    compiled = warm_up_rows(plugin, how.max_tokens[0], kept)
    warm_timeout = min(args.warm_up_timeout, (deadline - time.time()) * 0.4) if deadline else args.warm_up_timeout
    fresh = warm_up(compiled, work, env, warm_timeout, info.get("memory_gib"), compile_seconds_known(args.out, RESULTS))
    record["warm_up"] = merge_warm_ups(earlier.get("warm_up", {}), fresh)
    record["warm_up_s"] = round(time.time() - start, 1)
    write_record(record_path, finish(record))
    measured_from = how.log_interval
    run_child(stock, "stock", work, record_path, env, deadline, measured_from)
    run_child(plugin, "plugin", work, record_path, env, deadline, measured_from)
    with open(record_path) as f:
        record = json.load(f)
    record["seconds"] = round(time.time() - start, 1)
    write_record(record_path, finish(record))
    print("\n" + markdown(record))
    print(f"\n[speed] wrote {record_path} and its .md ({record['seconds']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
