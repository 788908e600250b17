"""Where does a model first produce a non-finite value under mixed precision? One train step, every module watched.

Builds an arch (paper defaults, or ``--tiny``), takes one batch (a fairseq data-bin's first ``--max-tokens`` batch,
or random sentences), runs forward + backward under ``torch.autocast(device, dtype)`` without loss scaling, and
prints, in the order they happened, the modules whose forward output or whose gradient with respect to their
input holds inf/NaN (in the order they happened: the first forward event is where the forward pass breaks;
the first backward event names the module fed by the op whose backward breaks), and the parameters with non-finite gradients.

    python -m umst_dev.find_nonfinite --arch umst_base --device cuda --dtype bf16 --data demo/data-bin
    python -m umst_dev.find_nonfinite --arch prime_simple_base --tiny --device cuda --dtype fp16
"""
import argparse
import contextlib
import sys

import torch
import torch.nn.functional as F

from umst_dev import dev
from umst_dev.op_counts import tensors_in

TINY = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32,
            decoder_ffn_embed_dim=32, encoder_attention_heads=2, decoder_attention_heads=2)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


def nonfinite(x):
    return any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in tensors_in(x))


def watch(model, events):
    """Forward hooks: a module whose output is non-finite; on each output tensor a gradient hook: the gradient
    arriving at a module's output is non-finite (in backward order, the first such module is fed by the culprit).
    Tensor hooks, not full backward hooks: those wrap outputs in views that break fairseq's in-place ops."""
    handles = []

    for name, module in model.named_modules():
        def fwd(mod, args, out, name=name):
            label = name or "<model>"
            if nonfinite(out):
                events.append(("forward output", label, type(mod).__name__))
            for t in tensors_in(out):
                if t.requires_grad and t.is_floating_point():
                    def grad_hook(g, label=label, cls=type(mod).__name__):
                        if not bool(torch.isfinite(g).all()):
                            events.append(("gradient at output", label, cls))
                    t.register_hook(grad_hook)

        handles.append(module.register_forward_hook(fwd))
    return handles


def batch_from_databin(data, arch, overrides, max_tokens):
    task = dev.setup_task(data, overrides, arch=arch)
    task.load_dataset("train")
    itr = task.get_batch_iterator(task.dataset("train"), max_tokens=max_tokens, seed=1).next_epoch_itr(shuffle=False)
    return task, next(iter(itr))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument("--tiny", action="store_true", help="2+2 layers, d 16 (the model checks' sizes)")
    p.add_argument("--data", default=None, help="a data-bin (with side files for UMST); default: random sentences")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--sentences", type=int, default=5, help="random batch: sentences (default 5)")
    p.add_argument("--src-len", type=int, default=12, help="random batch: longest source (default 12)")
    p.add_argument("--source-lang", default="kel", help="of the data-bin (default: the toy corpus's kel)")
    p.add_argument("--target-lang", default="mor")
    p.add_argument("--eval", action="store_true", help="dropout off")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sdpa", default=None,
                   help="comma-separated SDPA backends allowed (MATH, EFFICIENT_ATTENTION, FLASH_ATTENTION, "
                        "CUDNN_ATTENTION); default: torch's choice")
    args = p.parse_args(argv)
    overrides = dict(TINY) if args.tiny else {}
    overrides["share_all_embeddings"] = True
    if args.data:
        overrides.update(source_lang=args.source_lang, target_lang=args.target_lang)
        task, sample = batch_from_databin(args.data, args.arch, overrides, args.max_tokens)
        torch.manual_seed(args.seed)
        model = task.build_model(dev.parse_args(args.arch, overrides, data=args.data))
    else:
        model, task = dev.build_model(args.arch, overrides, seed=args.seed)
        sample = dev.collate(dev.random_dataset(task, args.sentences, args.src_len, args.src_len, seed=11),
                             range(args.sentences))
    sample = dev.move_sample(sample, args.device)
    model = model.to(args.device)
    model.train(not args.eval)
    events = []
    handles = watch(model, events)
    pad = task.target_dictionary.pad()
    dtype = DTYPES[args.dtype]
    backends = contextlib.nullcontext()
    if args.sdpa:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = sdpa_kernel([getattr(SDPBackend, b) for b in args.sdpa.split(",")])
    with backends:
        with torch.autocast(args.device, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(**dev.model_inputs(model, sample))[0]
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), sample["target"].view(-1),
                               ignore_index=pad)
        print(f"{args.arch} {args.dtype} on {args.device}: loss {loss.item():.4f}, "
              f"{tuple(sample['net_input']['src_tokens'].shape)} source, {tuple(sample['target'].shape)} target")
        loss.backward()
    for h in handles:
        h.remove()
    for kind, name, cls in events[:12]:
        print(f"  {kind}: {name} ({cls})")
    bad = [n for n, q in model.named_parameters() if q.grad is not None and not torch.isfinite(q.grad).all()]
    print(f"  parameters with non-finite gradients: {len(bad)} {bad[:12]}")
    big = sorted(((float(q.grad.abs().max()), n) for n, q in model.named_parameters() if q.grad is not None
                  and torch.isfinite(q.grad).all()), reverse=True)[:5]
    print(f"  largest finite |grad|: {[(n, f'{v:.3g}') for v, n in big]}")
    return 1 if events or bad else 0


if __name__ == "__main__":
    sys.exit(main())
