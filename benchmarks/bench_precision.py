"""Training and decoding words/s in fp32, bf16 autocast (``--amp --amp-dtype bfloat16``) and pure bf16
(``fairseq-hydra-train common.bf16=true``: bf16 weights), every model of a group in one process, the
precisions interleaved call by call, ratios against fp32 and against fairseq's transformer of the same run.

    OMP_NUM_THREADS=1 python -m benchmarks precision --group m30k     # the Multi30k rows (d 128)
    OMP_NUM_THREADS=1 python -m benchmarks precision --group base     # umst_base vs transformer (d 512)
    python -m benchmarks precision --group m30k --quick               # smoke run

Models: ``m30k`` builds every ``configs/m30k-*.yaml`` row's model (its ``model:`` section, 9,712-type joined
dictionary as docs/multi30k.md); ``base`` builds ``umst_base`` and the pre-norm ``transformer_wmt_en_de`` at
their defaults (d 512, 6+6 layers) on a 32K dictionary. Batches: real collated batches of the task's own
dataset classes (random sentences, random dependency trees). Training = forward + backward of the token
cross entropy (no optimizer step: fp32 master weights cost the same in every column); decoding = beam 4,
forced to ``--gen-len`` tokens (min_len = max_len) so that every precision does the same work. Times are this
process's CPU time (``--threads 1``: robust to the other jobs of a shared machine), medians over ``--iters``
rounds after one warm-up call of each. The table's header records the CPU, its bf16 features, torch's CPU
capability and whether oneDNN has bf16 kernels for it, and the load average.
"""
import glob
import os
import statistics

import torch
from omegaconf import OmegaConf

from benchmarks import common
from benchmarks.common import ROOT
from umst_dev import dev

PRECISIONS = ("fp32", "bf16-autocast", "bf16")
BASE_MODELS = {"transformer": ("transformer_wmt_en_de", {"encoder_normalize_before": True,
                                                         "decoder_normalize_before": True,
                                                         "share_all_embeddings": True}),
               "umst_base": ("umst_base", {"share_all_embeddings": True})}


def m30k_models():
    """name -> (arch, overrides) of every Multi30k row config; the baseline first."""
    models = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "m30k-*.yaml")),
                       key=lambda p: (not p.endswith("m30k-transformer.yaml"), p)):
        model_cfg = OmegaConf.to_container(OmegaConf.load(path).model)
        arch = model_cfg.pop("_name")
        models[os.path.basename(path)[len("m30k-"):-len(".yaml")]] = (arch, model_cfg)
    return models


def hardware():
    flags = set()
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16"]
    return {"cpu": model, "bf16_flags": {k: k in flags for k in wanted},
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
            "load_average": os.getloadavg(), "torch": torch.__version__, "threads": torch.get_num_threads()}


def to_precision(model, precision):
    """Weights in bf16 for pure bf16, fp32 otherwise (autocast keeps fp32 master weights)."""
    return model.to(torch.bfloat16 if precision == "bf16" else torch.float32)


def autocast_for(precision):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-autocast")


def train_step_fn(model, sample, precision):
    """forward (under autocast for bf16-autocast) + backward outside it, as fairseq's train_step runs them
    (a backward inside autocast would autocast the hand-written backwards of custom autograd functions too)."""
    pad = model.decoder.dictionary.pad()
    net_input = dev.model_inputs(model, sample)

    def step():
        model.zero_grad(set_to_none=True)
        with autocast_for(precision):
            logits = model(**net_input)[0]
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                                     sample["target"].view(-1), ignore_index=pad)
        loss.backward()
    return step


def bench_model(arch, overrides, dictionary, args):
    model, task = dev.build_model(arch, overrides, dictionary=dictionary)
    n_params = common.n_params(model)
    train_batch = dev.collate(dev.random_dataset(task, args.batch, args.len, args.len, seed=1, min_len=args.len // 2),
                              range(args.batch))
    gen_batch = dev.collate(dev.random_dataset(task, args.gen_batch, args.len, args.len, seed=2,
                                               min_len=args.len // 2), range(args.gen_batch))
    train_words = int(train_batch["target"].ne(dictionary.pad()).sum())
    from fairseq.sequence_generator import SequenceGenerator

    # One model object per precision would triple the memory of the base models: cast the weights between
    # calls instead, outside the timed region.
    state = {"precision": None}

    def prepared(precision, train):
        def setup():
            if state["precision"] != precision:
                to_precision(model, precision)
                state["precision"] = precision
            model.train(train)
        return setup

    results = {}
    for what in ("train", "decode"):
        fns = {}
        for precision in PRECISIONS:
            if what == "train":
                step = train_step_fn(model, train_batch, precision)
            else:
                generator = SequenceGenerator([model], task.target_dictionary, beam_size=4, max_len_a=0,
                                              max_len_b=args.gen_len, min_len=args.gen_len)

                def step(generator=generator, precision=precision):
                    with torch.no_grad(), autocast_for(precision):
                        return task.inference_step(generator, [model], gen_batch)
            fns[precision] = (prepared(precision, what == "train"), step)
        times = {p: [] for p in PRECISIONS}
        for round_ in range(args.iters + 1):
            for precision, (setup, fn) in fns.items():
                setup()
                _, seconds = common.timed(fn, cpu_time=True)
                if round_ > 0:  # the first round warms up
                    times[precision].append(seconds)
        words = train_words if what == "train" else args.gen_batch * (args.gen_len + 1)
        results[what] = {p: words / statistics.median(t) for p, t in times.items()}
    to_precision(model, "fp32")
    return n_params, results


def main():
    p = common.base_argparser(__doc__.split("\n")[0])
    p.add_argument("--group", choices=["m30k", "base"], default="m30k")
    p.add_argument("--models", default=None, help="comma-separated subset of the group's model names")
    p.add_argument("--batch", type=int, default=None, help="training sentences per batch")
    p.add_argument("--gen-batch", type=int, default=None, help="decoding sentences per batch")
    p.add_argument("--len", type=int, default=None, help="source/target length (sentences of len/2..len)")
    p.add_argument("--gen-len", type=int, default=None, help="decoded tokens per sentence (forced)")
    p.set_defaults(iters=2, threads=1)
    args = p.parse_args()
    m30k = args.group == "m30k"
    # Small enough for a minute or two of CPU time per model on a CPU where bf16 is emulated.
    defaults = dict(batch=32, gen_batch=8, len=20, gen_len=12) if m30k else dict(batch=8, gen_batch=4, len=24,
                                                                                   gen_len=8)
    if args.quick:
        defaults = dict(batch=4, gen_batch=2, len=8, gen_len=4)
        args.iters = 1
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    common.setup(args)
    models = m30k_models() if m30k else dict(BASE_MODELS)
    if args.models:
        models = {k: models[k] for k in args.models.split(",")}
    baseline = "transformer"
    dictionary = dev.make_dictionary(9712 if m30k else 32000)
    hw = hardware()
    print(f"hardware: {hw}")
    print(f"batch: train {args.batch} sentences of {args.len // 2}-{args.len} tokens, decode {args.gen_batch} "
          f"sentences, beam 4, {args.gen_len} tokens forced; CPU time, median of {args.iters}")
    rows, raw = [], {}
    for name, (arch, overrides) in models.items():
        n_params, res = bench_model(arch, overrides, dictionary, args)
        raw[name] = {"arch": arch, "params": n_params, **res}
        print(f"{name}: {raw[name]}", flush=True)
    for name, r in raw.items():
        base = raw.get(baseline)
        for what in ("train", "decode"):
            fp32 = r[what]["fp32"]
            rows.append([name, what, f"{r['params'] / 1e6:.2f}M", f"{fp32:.0f}",
                         f"{r[what]['bf16-autocast']:.0f} ({r[what]['bf16-autocast'] / fp32:.2f}x)",
                         f"{r[what]['bf16']:.0f} ({r[what]['bf16'] / fp32:.2f}x)",
                         " / ".join(f"{r[what][p] / base[what][p]:.2f}" for p in PRECISIONS) if base else "-"])
    hw["load_average_end"] = os.getloadavg()
    common.print_table(f"words/s on CPU ({args.group}), fp32 vs bf16 autocast vs pure bf16",
                       ["model", "step", "params", "fp32 words/s", "bf16 autocast words/s (x fp32)",
                        "pure bf16 words/s (x fp32)", "vs transformer (fp32 / autocast / bf16)"], rows,
                       json_path=args.json)
    print(f"\nload average start {hw['load_average']}, end {hw['load_average_end']}")
    if args.json:
        import json

        with open(args.json) as f:
            table = json.load(f)
        table.update(hardware=hw, raw=raw, args=vars(args))
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
