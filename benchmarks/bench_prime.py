"""Speed of the Unified Transformer (Prime / Prime-simple) against fairseq's transformer, in one run.

Measures, per model, on the same inputs and thread settings:
  * batch-size-1 inference (the paper's online setting, its table 3): fairseq's SequenceGenerator
    (beam search, incremental decoding), every sentence forced to the same output length so that all
    models produce the same number of tokens; reported as generated tokens per second;
  * one training step (forward, label-smoothed loss, backward, Adam step) on a fixed batch.
Ratios are against the transformer of matched parameter count measured in the same run.

Pairs (each: candidate vs baseline):
  table3   Prime-simple 6+6 layers d=512 FFN 2048 8 heads  vs  transformer 6+6 d=512 (the paper's table 3 setting:
           same size, same depth; the paper reports +31% tokens/s on GPU), plus the same Prime-simple computed
           with --prime-unfused-projections to isolate the fused form;
  base     prime_simple_base / prime_base (12+12, d=384)   vs  transformer_iwslt_de_en (6+6, d=512), the
           parameter-matched IWSLT baselines (table 2 sizes, 44M / 49M vs 43M at the IWSLT vocabulary).

Usage:
  python benchmarks/bench_prime.py --quick          # a few minutes on one CPU thread
  python benchmarks/bench_prime.py                  # more sentences / repeats, both pairs
  python benchmarks/bench_prime.py --device cuda    # on a GPU (threads setting ignored there)
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import umst_plugin  # noqa: E402,F401  (registers prime)
from fairseq import options  # noqa: E402
from fairseq.data import Dictionary  # noqa: E402
from fairseq.sequence_generator import SequenceGenerator  # noqa: E402
from fairseq.tasks.translation import TranslationTask  # noqa: E402

PAIRS = {
    "table3": [
        ("transformer 6+6 d512", "transformer", {}),
        ("prime_simple 6+6 d512 fused", "prime_simple_base",
         dict(encoder_layers=6, decoder_layers=6, encoder_embed_dim=512, encoder_ffn_embed_dim=2048,
              encoder_attention_heads=8)),
        ("prime_simple 6+6 d512 unfused", "prime_simple_base",
         dict(encoder_layers=6, decoder_layers=6, encoder_embed_dim=512, encoder_ffn_embed_dim=2048,
              encoder_attention_heads=8, prime_unfused_projections=True)),
    ],
    "base": [
        ("transformer_iwslt_de_en 6+6 d512", "transformer_iwslt_de_en", {}),
        ("prime_simple_base 12+12 d384", "prime_simple_base", {}),
        ("prime_base 12+12 d384 (k=3,15)", "prime_base", {}),
    ],
}


def build(arch, overrides, vocab, dropout):
    dictionary = Dictionary()
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    cli = ["/nonexistent", "--task", "translation", "--arch", arch, "-s", "src", "-t", "tgt",
           "--dropout", str(dropout), "--share-all-embeddings"]
    for key, value in overrides.items():
        flag = "--" + key.replace("_", "-")
        cli += [flag] if value is True else [flag, str(value)]
    args = options.parse_args_and_arch(options.get_training_parser(), cli)
    task = TranslationTask(args, dictionary, dictionary)
    torch.manual_seed(0)
    return task.build_model(args), dictionary


def sources(n, vocab, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = lengths[i % len(lengths)]
        toks = torch.randint(4, vocab, (1, length), generator=g)
        toks[0, -1] = 2
        out.append(toks)
    return out


def inference_runner(model, dictionary, srcs, out_len, beam, device):
    """A callable translating source i alone (batch size 1); returns (tokens generated, seconds)."""
    gen = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=out_len, min_len=out_len)
    samples = [{"net_input": {"src_tokens": s.to(device), "src_lengths": torch.tensor([s.size(1)], device=device)}}
               for s in srcs]

    def run(i):
        model.eval()
        with torch.no_grad():
            _sync(device)
            start = _clock(device)
            tokens = gen.generate([model], samples[i])[0][0]["tokens"].numel()
            _sync(device)
        return tokens, _clock(device) - start

    return run


def train_step_runner(model, vocab, bsz, src_len, tgt_len, device):
    """A callable doing forward + label-smoothed loss + backward + Adam step; returns seconds."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (bsz, src_len), generator=g).to(device)
    prev = torch.randint(4, vocab, (bsz, tgt_len), generator=g).to(device)
    target = torch.randint(4, vocab, (bsz, tgt_len), generator=g).to(device)
    lengths = torch.full((bsz,), src_len, device=device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def run():
        model.train()
        _sync(device)
        start = _clock(device)
        logits = model(src, lengths, prev)[0]
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), target.view(-1), label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        _sync(device)
        return _clock(device) - start

    return run


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _clock(device):
    """CPU: seconds of CPU time of this process (with one thread, the work done, however busy the machine is).
    CUDA: wall-clock seconds (after synchronising)."""
    return time.perf_counter() if device.type == "cuda" else time.process_time()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer sentences and repeats (a few minutes on CPU)")
    p.add_argument("--pairs", default=None, help="comma-separated subset of: " + ",".join(PAIRS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=1, help="CPU intra-op threads")
    p.add_argument("--vocab", type=int, default=8000, help="joined vocabulary size (shared embeddings)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--out-len", type=int, default=None, help="forced output length per sentence")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    quick = args.quick
    n_sent = 4 if quick else 10
    out_len = args.out_len or (16 if quick else 30)
    repeats = 3 if quick else 5
    train_shape = (8, 16, 16) if quick else (16, 30, 30)
    pairs = args.pairs.split(",") if args.pairs else (["table3"] if quick else list(PAIRS))
    srcs = sources(n_sent, args.vocab, lengths=[12, 20, 16, 24] if quick else [15, 25, 20, 30, 35, 18])

    print(f"clock={'wall' if device.type == 'cuda' else 'process CPU time'} device={device} threads={args.threads} vocab={args.vocab} beam={args.beam} sentences={n_sent} "
          f"out_len={out_len} repeats={repeats} train_batch(bsz,src,tgt)={train_shape} torch={torch.__version__}")
    rows = []
    for pair in pairs:
        entries = []
        for name, arch, overrides in PAIRS[pair]:
            model, dictionary = build(arch, overrides, args.vocab, dropout=0.1)
            model.to(device)
            infer = inference_runner(model, dictionary, srcs, out_len, args.beam, device)
            train = train_step_runner(model, args.vocab, *train_shape, device)
            infer(0), train()  # warm-up; the first step also allocates Adam's state
            entries.append(dict(name=name, params=sum(p.numel() for p in model.parameters()), infer=infer,
                                train=train, steps=[]))
        # Interleave the models sentence by sentence and repeat by repeat, so that load from other processes
        # hits them alike; per sentence keep the fastest repeat (the least disturbed) and also the median.
        for e in entries:
            e["best"], e["median"], e["tokens"] = 0.0, 0.0, 0
        for i in range(len(srcs)):
            times = {id(e): [] for e in entries}
            for _ in range(repeats):
                for e in entries:
                    tokens, seconds = e["infer"](i)
                    times[id(e)].append(seconds)
            for e in entries:
                e["best"] += min(times[id(e)])
                e["median"] += statistics.median(times[id(e)])
                e["tokens"] += tokens
        for _ in range(repeats):
            for e in entries:
                e["steps"].append(e["train"]())
        base = entries[0]
        for e in entries:
            rate, rate_med = e["tokens"] / e["best"], e["tokens"] / e["median"]
            base_rate, base_rate_med = base["tokens"] / base["best"], base["tokens"] / base["median"]
            step, step_med = min(e["steps"]), statistics.median(e["steps"])
            rows.append((pair, e["name"], e["params"] / 1e6, rate, rate / base_rate, rate_med / base_rate_med,
                         step * 1e3, step / min(base["steps"]), step_med / statistics.median(base["steps"])))
            print(f"  [{pair}] {e['name']}: {rate:.1f} tok/s (best per sentence), {rate_med:.1f} (median); "
                  f"train step s {[round(t, 3) for t in e['steps']]}", flush=True)
        del entries

    header = ("pair", "model", "params(M)", "bs1 tok/s (best)", "x base (best)", "x base (median)",
              "train step ms (best)", "x base (best)", "x base (median)")
    widths = [max(len(h), *(len(_fmt(r[i])) for r in rows)) for i, h in enumerate(header)]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(_fmt(v).ljust(w) for v, w in zip(r, widths)))
    print("x base: ratio to the first row of the pair measured in the same run; tokens/s: higher is faster, "
          "train step: lower is faster. best = per sentence (tokens/s) or step, the fastest of the interleaved repeats; median = their median.")
    return rows


def _fmt(v):
    return f"{v:.2f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    main()
