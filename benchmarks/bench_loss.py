"""The criterion's loss, fairseq's eager code against the compiled region of ``--compile``
(``umst_plugin/compilation/loss.py``): one forward + backward of the label-smoothed cross-entropy (epsilon 0.1)
from logits of TOKENS x VOCAB, per dtype of the logits, in one process, the two interleaved call by call.

    python -m benchmarks loss --tokens 4096 --vocab 32768 --dtypes fp32,bf16 --json loss.json      # a CPU: a proxy
    python -m benchmarks loss --device cuda --tokens 38400 --vocab 32768 --dtypes bf16             # the recipe's batch
    python -m benchmarks loss --quick                                                              # smoke run (CI)

The logits are what the decoder's output projection hands the criterion (a leaf here: the projection itself is
the same in both), the targets random with a tenth of each row padding. Per row: the median seconds of each
(after ``--warmup`` calls, over ``--iters``), compiled / eager, the compile seconds, the largest differences of
the loss and of the logits' gradient, and on CUDA the peak memory of each and their kernels' time by category
(one profiled call). On a CPU every figure is a proxy for the GPU's (and bf16 is emulated where the CPU has no
bf16 instructions: ``benchmarks/common.cpu_name`` says).
"""
import statistics
import time

import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

from benchmarks import common
from umst_dev import dev
from umst_plugin import compilation
from umst_plugin.compilation import loss as compiled_loss

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
EPSILON = 0.1
LENGTH = 32  # target tokens per sentence: rows of TOKENS / LENGTH sentences
TINY = dict(encoder_layers=1, decoder_layers=1, encoder_embed_dim=8, decoder_embed_dim=8, encoder_ffn_embed_dim=8,
            decoder_ffn_embed_dim=8, encoder_attention_heads=1, decoder_attention_heads=1)


def _problem(tokens, vocab, device, seed=0):
    """(model, eager criterion, compiled criterion, sample): a model only for its get_normalized_probs and
    get_targets (fairseq's transformer; the loss reads nothing else of it), a dictionary of ``vocab`` entries."""
    model, task = dev.build_model("transformer", TINY, vocab=vocab - 4)  # + fairseq's 4 special symbols
    model.to(device)
    eager = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=EPSILON)
    compiled = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=EPSILON)
    compilation.check_available(device)
    assert compiled_loss.compile_criterion(compiled)
    generator = torch.Generator().manual_seed(seed)
    rows = max(2, tokens // LENGTH)
    target = torch.randint(4, len(task.target_dictionary), (rows, LENGTH), generator=generator)
    lengths = LENGTH - torch.randint(0, LENGTH // 5 + 1, (rows,), generator=generator)  # a tenth padding on average
    target[torch.arange(LENGTH)[None, :] >= lengths[:, None]] = task.target_dictionary.pad()
    return model, eager, compiled, {"target": target.to(device)}


def _step(criterion, model, logits, sample):
    def step():
        logits.grad = None
        loss, _ = criterion.compute_loss(model, (logits, {}), sample)
        loss.backward()
        return loss.detach(), logits.grad
    return step


def _kernels(fn):
    """One call of ``fn`` profiled on CUDA: its kernels' time by category (``common.kernel_breakdown``)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return common.kernel_breakdown(prof.events())


def eager_traffic(fn):
    """Bytes the ATen ops of one call of ``fn`` read and write, counted as the simulated GPU counts a library call
    (docs/compile.md): every tensor input's and output's elements once (an expanded input by its storage), views
    not counted. Returns (bytes, ops)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    def size(t):
        return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())

    class Count(TorchDispatchMode):
        bytes, ops = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view and func not in (torch.ops.aten.detach.default,):
                tensors = [t for t in tree_leaves((args, kwargs or {}, out)) if isinstance(t, torch.Tensor)]
                Count.bytes += sum(size(t) for t in tensors)
                Count.ops += 1
            return out

    with Count():
        fn()
    return Count.bytes, Count.ops


def bench(tokens, vocab, dtypes, device, iters, warmup, cpu_time=False):
    model, eager_criterion, compiled_criterion, sample = _problem(tokens, vocab, device)
    rows = []
    for name in dtypes:
        generator = torch.Generator().manual_seed(1)
        logits = (3 * torch.randn(*sample["target"].shape, vocab, generator=generator)).to(device, DTYPES[name])
        logits.requires_grad_()
        fns = {"eager": _step(eager_criterion, model, logits, sample),
               "compiled": _step(compiled_criterion, model, logits, sample)}
        want_loss, want_grad = (t.clone() for t in fns["eager"]())
        compiling = compilation.compile_seconds()  # dynamo's own total: this dtype's first call compiles
        got_loss, got_grad = (t.clone() for t in fns["compiled"]())
        compile_s = compilation.compile_seconds() - compiling
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        times = common.interleaved_times(fns, iters, device, cpu_time=cpu_time)
        row = dict(dtype=name, tokens=int(sample["target"].numel()), vocab=vocab,
                   eager_s=statistics.median(times["eager"]), compiled_s=statistics.median(times["compiled"]),
                   compile_s=round(compile_s, 1),
                   loss_rel_diff=abs(got_loss.item() - want_loss.item()) / abs(want_loss.item()),
                   grad_max_diff=(got_grad.float() - want_grad.float()).abs().max().item())
        row["compiled_vs_eager"] = row["compiled_s"] / row["eager_s"]
        traffic, ops = eager_traffic(fns["eager"])
        row.update(eager_ops=ops, eager_bytes_per_logit=traffic / logits.numel())
        if str(device).startswith("cuda"):
            for which, fn in fns.items():
                row[f"{which}_peak_mib"] = common.peak_memory(fn, device) / 2 ** 20
                row[f"{which}_kernels"] = _kernels(fn)
        rows.append(row)
        print(f"[loss] {name}: eager {row['eager_s'] * 1e3:.1f} ms, compiled {row['compiled_s'] * 1e3:.1f} ms "
              f"({row['compiled_vs_eager']:.2f}x), compiled in {compile_s:.1f} s", flush=True)
    return rows


def markdown(result):
    clock = "CPU time" if result.get("cpu_time") else "wall clock"
    lines = [f"{result['device']}, torch {result['torch']}, {result['threads']} thread(s), {clock}; "
             f"`{result['command']}`", "",
             "| logits | tokens x vocabulary | eager ms | compiled ms | compiled / eager | compile s "
             "| eager: ATen ops, bytes per logit | loss rel. diff | gradient max diff |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['dtype']} | {r['tokens']:,} x {r['vocab']:,} | {r['eager_s'] * 1e3:.1f} "
                     f"| {r['compiled_s'] * 1e3:.1f} | {r['compiled_vs_eager']:.2f} | {r['compile_s']:.1f} "
                     f"| {r['eager_ops']}, {r['eager_bytes_per_logit']:.1f} "
                     f"| {r['loss_rel_diff']:.1e} | {r['grad_max_diff']:.1e} |")
    return "\n".join(lines)


def main(argv=None):
    import sys

    p = common.base_argparser(__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--dtypes", default="fp32,bf16", help=f"comma-separated, of {', '.join(DTYPES)}")
    p.add_argument("--markdown", default=None, help="also write the table as markdown here")
    p.add_argument("--cpu-time", action="store_true",
                   help="on a CPU: this process's CPU time instead of the wall clock (with --threads 1, the work "
                        "done whatever else runs on the machine)")
    args = p.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        p.error(f"--dtypes: unknown {', '.join(unknown)} (known: {', '.join(DTYPES)})")
    if args.quick:
        args.tokens, args.vocab, args.iters, args.warmup = 128, 100, 2, 1
    common.setup(args)
    start = time.perf_counter()
    rows = bench(args.tokens, args.vocab, dtypes, args.device, args.iters, args.warmup, args.cpu_time)
    result = dict(what="the criterion's loss, eager against compiled: one forward + backward",
                  device=common.device_name(args.device), torch=torch.__version__, threads=torch.get_num_threads(),
                  command="python -m benchmarks loss " + " ".join(sys.argv[1:] if argv is None else argv),
                  cpu_time=bool(args.cpu_time and not str(args.device).startswith("cuda")), epsilon=EPSILON,
                  rows=rows, seconds=round(time.perf_counter() - start, 1))
    table = markdown(result)
    print(table)
    common.write_results(result, table, args.json, args.markdown)
    return result


if __name__ == "__main__":
    main()
