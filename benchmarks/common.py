"""Shared benchmark harness: same batch, same machine, one process, ratios against a baseline.

Timings are medians over ``iters`` repetitions after ``warmup``; ``cpu_time=True`` clocks this process's CPU
time instead of the wall clock on CPU (steadier on a shared machine with one intra-op thread), and
``interleaved_times`` alternates the compared candidates call by call. Peak memory:
on CUDA, ``torch.cuda.max_memory_allocated``; on CPU, the high-water mark of
the live tensor bytes replayed from the profiler's raw allocation/free records
(``profile_memory=True``; frees matched to the call's own allocations by address),
i.e. activations + gradients allocated during the measured call, not the process RSS (which the allocator's caching makes
meaningless for one call).
"""
import argparse
import collections
import json
import logging
import os
import platform
import statistics
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def __getattr__(name):
    """``common.dev`` (``umst_dev.dev``) on first use: importing this module must not import the plugin, whose
    ``__init__`` patches fairseq; bench_launches' stock row profiles with :func:`cuda_profile` in a process that
    must stay stock fairseq."""
    if name == "dev":
        from umst_dev import dev
        return dev
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        # the units bf16 matmuls run on (AMX: 6.1-9.1x fp32's GFLOP/s, docs/results/matmul-cpu-amx.json); with neither,
        # torch converts bf16 to fp32 and back (0.13x fp32 on an AVX2 EPYC): what a CPU's bf16 times can mean
        extra = (", avx512_bf16" if "avx512_bf16" in flags else "") + (", AMX" if "amx_bf16" in flags else "")
        return f"{model} (family {family}, model {number}), {isa}{extra}, {os.cpu_count()} cores"
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def device_name(device):
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(device)
    return cpu_name()


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def clock(device="cpu", cpu_time=False):
    """Seconds: wall clock, or with ``cpu_time`` on a CPU device this process's CPU time (with one intra-op
    thread, the work done, whatever else runs on the machine). On CUDA always the wall clock."""
    if cpu_time and not str(device).startswith("cuda"):
        return time.process_time()
    return time.perf_counter()


def timed(fn, device="cpu", cpu_time=False):
    """(fn's result, seconds one call of fn took, synchronised on CUDA)."""
    sync(device)
    start = clock(device, cpu_time)
    result = fn()
    sync(device)
    return result, clock(device, cpu_time) - start


def median_time(fn, iters=5, warmup=2, device="cpu", cpu_time=False):
    for _ in range(warmup):
        fn()
    return statistics.median(timed(fn, device, cpu_time)[1] for _ in range(iters))


def interleaved_times(fns, repeats, device="cpu", cpu_time=False, results=None):
    """Seconds of ``repeats`` calls of each of ``fns`` (name -> callable), called in turn, one round after
    another, so that load from other processes on a shared machine hits every candidate alike.
    Returns name -> list of seconds (one per round); a dict passed as ``results`` receives name -> the
    value the last call returned."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            value, seconds = timed(fn, device, cpu_time)
            times[name].append(seconds)
            if results is not None:
                results[name] = value
    return times


def peak_memory(fn, device="cpu"):
    """Peak bytes allocated by one call of fn (beyond what was live before it)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # Replay the raw allocation records in time order (temporaries inside fused kernels included;
    # per-op summaries net those out and undercount). Only blocks allocated inside this call are
    # counted, frees matched to them by address: c10's CPU reporter keeps a pointer -> size table
    # across profiling sessions and reports a free of a block allocated outside any session with a
    # stale size from an earlier session, which made the result depend on what the process had
    # profiled before (same model measured 609, 522, 503 MB in one process).
    allocations = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation:
            allocations.append((event.start_time_ns, event.extra_fields.ptr, event.extra_fields.alloc_size))
        stack.extend(event.children)
    sizes, live, peak = {}, 0, 0
    for _, ptr, nbytes in sorted(allocations, key=lambda a: a[0]):
        if nbytes > 0:
            sizes[ptr] = nbytes
            live += nbytes
            peak = max(peak, live)
        elif ptr in sizes:
            live -= sizes.pop(ptr)
    return peak


def train_step_fn(model, sample):
    """forward + backward of the token-level cross entropy (what fairseq-train does per batch)."""
    pad = model.decoder.dictionary.pad()
    from umst_dev import dev

    net_input = dev.model_inputs(model, sample)

    def step():
        model.zero_grad(set_to_none=True)
        logits = model(**net_input)[0]
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                                 sample["target"].view(-1), ignore_index=pad)
        loss.backward()
    return step


def generate_fn(model, task, sample, beam=4, max_len_b=10):
    from fairseq.sequence_generator import SequenceGenerator

    generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=1,
                                  max_len_b=max_len_b)
    result = {}

    def gen():
        with torch.no_grad():
            hyps = task.inference_step(generator, [model], sample)
        result["tokens"] = sum(len(h[0]["tokens"]) for h in hyps)
    return gen, result


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def eager_fallback_lines(labelled_rows, what="kernels"):
    """Markdown beneath a table of compiled rows: each layer variant that fell back to eager (a row's
    ``eager_fallbacks``, ``umst_dev.compiled_layers.fallback_record``), after the row's label; none without one.
    ``labelled_rows``: (label, row) pairs; ``what``: what the table's numbers for such a row are."""
    fallbacks = [(label, f) for label, r in labelled_rows for f in r.get("eager_fallbacks") or []]
    if not fallbacks:
        return []
    return (["", f"Compiled layers that fell back to eager (their {what} above are eager ones):", ""]
            + [f"* {label}: {f}" for label, f in fallbacks])


def partly_eager(row):
    """The mark after a compiled row's label whose layers partly ran eager (see :func:`eager_fallback_lines`)."""
    return " (partly eager: below)" if row.get("eager_fallbacks") else ""


def fell_back(row):
    """The lines a benchmark prints under a row's summary for its fallbacks to eager."""
    return "".join(f"\n    FELL BACK TO EAGER: {f}" for f in row.get("eager_fallbacks") or [])


def write_results(result, table, json_path=None, markdown_path=None):
    """A benchmark's result as JSON (``--json``) and its markdown table (``--markdown``), each where asked, their
    folders made as needed."""
    for path, text in ((json_path, json.dumps(result, indent=1)), (markdown_path, table + "\n")):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)


def print_table(title, header, rows, json_path=None):
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row) + " |")
    if json_path:
        os.makedirs(os.path.dirname(json_path) or ".", exist_ok=True)
        with open(json_path, "w") as f:
            json.dump({"title": title, "header": header, "rows": rows}, f, indent=1)


def base_argparser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    p.add_argument("--json", default=None, help="also write the table as JSON here")
    return p


def setup(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"device={args.device} torch={torch.__version__} threads={torch.get_num_threads()}")


# ---- what a GPU does during a call: kernels, their time, how busy it is ----------------------------------------

PHASE_PREFIX = "phase:"  # record_function ranges named so attribute the kernels launched inside them


def _is_kernel(name):
    return not name.startswith(("Memcpy", "Memset", "memcpy", "memset"))


def kernels_by_phase(events, main_thread=None):
    """Kernels (count, microseconds) by phase from a CUDA profile's CPU event tree: a kernel belongs to the
    innermost ``record_function("phase:<name>")`` range around the op that launched it; ops of another CPU thread
    than ``main_thread`` (the autograd engine's device thread runs backward on a GPU) count as ``backward``;
    the rest as ``rest``. Memory copies and sets are not kernels."""
    from torch.autograd import DeviceType

    counts, times = collections.Counter(), collections.Counter()
    roots = [e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None]
    if main_thread is None:
        marked = [e for e in roots if e.name.startswith(PHASE_PREFIX)]
        main_thread = marked[0].thread if marked else None
    stack = [(e, "rest" if main_thread is None or e.thread == main_thread else "backward") for e in roots]
    while stack:
        event, phase = stack.pop()
        if event.name.startswith(PHASE_PREFIX):
            phase = event.name[len(PHASE_PREFIX):]
        for kernel in event.kernels:
            if _is_kernel(kernel.name):
                counts[phase] += 1
                times[phase] += kernel.duration
        stack.extend((child, phase) for child in event.cpu_children)
    return counts, times


# what a CUDA kernel's name says it does, first match wins (inductor's generated kernels are "triton_": fused
# elementwise and reductions, whatever they compute, but "triton_tem_" its matmul templates; matmuls compiled code
# leaves to cuBLAS keep their names)
KERNEL_CATEGORIES = (
    ("communication", ("nccl",)),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "wgmma", "matmul", "triton_tem_")),
    ("convolution", ("conv",)),
    ("fused (inductor)", ("triton",)),
    ("softmax and loss", ("softmax", "nll_loss", "cross_entropy", "logsumexp")),
    ("layer norm", ("layer_norm", "layernorm", "norm_kernel")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("dropout", ("dropout", "bernoulli", "philox")),
    ("copy and cast", ("copy", "cast", "fill", "cat_", "catarray", "index", "gather", "scatter")),
    ("reduction", ("reduce", "sum_", "norm")),
    ("elementwise", ("elementwise", "vectorized", "unrolled")),
)


def kernel_category(name):
    """The category of a CUDA kernel by its name (:data:`KERNEL_CATEGORIES`), or "other"."""
    lowered = name.lower()
    for category, marks in KERNEL_CATEGORIES:
        if any(mark in lowered for mark in marks):
            return category
    return "other"


def kernel_breakdown(events, top=8):
    """Kernel time of a CUDA profile by category and by kernel: every kernel of every CPU op's launches
    (``event.kernels``; memory copies and sets are not kernels), as dict(kernels, kernel_ms, by_category {category:
    ms}, top [[name, ms, count], ...] longest first, names cut to 100 characters)."""
    from torch.autograd import DeviceType

    by_name, count = collections.defaultdict(lambda: [0.0, 0]), 0
    for event in events:
        if event.device_type != DeviceType.CPU:
            continue
        for kernel in event.kernels:
            if _is_kernel(kernel.name):
                entry = by_name[kernel.name]
                entry[0] += kernel.duration / 1000.0
                entry[1] += 1
                count += 1
    by_category = collections.Counter()
    for name, (ms, _) in by_name.items():
        by_category[kernel_category(name)] += ms
    longest = sorted(by_name.items(), key=lambda item: -item[1][0])[:top]
    return dict(kernels=count, kernel_ms=round(sum(ms for ms, _ in by_name.values()), 3),
                by_category={c: round(ms, 3) for c, ms in by_category.most_common()},
                top=[[name[:100], round(ms, 3), n] for name, (ms, n) in longest])


def cuda_profile(fn, repeats=3):
    """One call of ``fn`` under torch.profiler on CUDA, and ``repeats`` unprofiled calls timed by the wall clock:
    kernels launched, their summed time, the median wall time, GPU busy (kernel time / wall time; below 1 the GPU
    waited for the host to launch work), and kernels by phase (:func:`kernels_by_phase`)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    counts, times = kernels_by_phase(prof.events())
    walls = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
    wall = statistics.median(walls)
    kernel_s = sum(times.values()) / 1e6
    return dict(kernels=sum(counts.values()), kernel_ms=kernel_s * 1000, wall_ms=wall * 1000,
                busy=kernel_s / wall if wall else None, kernels_by_phase=dict(counts),
                kernel_ms_by_phase={k: v / 1000 for k, v in times.items()})


# ---- fairseq-train's main in this process, its progress records collected ----------------------------------------

class TrainInnerRecords(logging.Handler):
    """fairseq's json ``train_inner`` records (``--log-format json``), as they are logged, each with ``logged_at``
    (``time.monotonic()``: the end of its log interval, which the speed table's GPU-busy reading needs)."""

    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        message = record.getMessage()
        i = message.find("{")
        if i < 0 or '"wps"' not in message:
            return
        try:
            data = json.loads(message[i:])
        except ValueError:
            return
        if "num_updates" in data and "train_wps" not in data:  # (not the epoch's summary)
            data["logged_at"] = time.monotonic()
            self.records.append(data)


def train_in_process(argv, trainer_class=None):
    """fairseq-train's main on ``argv`` in this process, with ``trainer_class`` in place of fairseq's Trainer where
    given: its ``train_inner`` records (:class:`TrainInnerRecords`) and wall seconds."""
    import fairseq_cli.train as train_cli
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    handler = TrainInnerRecords()
    logging.getLogger().addHandler(handler)
    fairseq_trainer = train_cli.Trainer
    start = time.time()
    try:
        args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
        if trainer_class is not None:
            train_cli.Trainer = trainer_class
        train_cli.main(convert_namespace_to_omegaconf(args))
    finally:
        train_cli.Trainer = fairseq_trainer
        logging.getLogger().removeHandler(handler)
    return handler.records, time.time() - start
