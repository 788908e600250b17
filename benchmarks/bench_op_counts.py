"""Per architecture: matrix products left in fp32 under bf16 autocast, and host-device syncs per step.

Counted with ``umst_dev.op_counts`` (TorchDispatchMode: every aten op, on the CPU as on a GPU), at each arch's
paper-default width on a batch of 8 random sentences of up to 12 subwords:

* ``fp32 bwd``: matrix products of one backward pass under ``torch.autocast("cpu", bfloat16)`` whose inputs
  are all float32, of ``bwd`` in all, with the paper's dropout (train mode) and with dropout off. With attention
  dropout, torch's ``scaled_dot_product_attention`` on a CPU has no fused kernel and falls back to its math
  path, which upcasts to float32: fairseq's MultiheadAttention (every decoder here, MSC's and TranSFormer's
  encoders) then runs its attention matmuls in fp32 on a CPU; on CUDA the fused kernels take the dropout in
  bf16 (the GPU check counts there). The plugin's own attentions avoid it (``modules/common/attention.py``);
* ``syncs``: host-device syncs of one training step (forward, loss, backward) and of incremental decoding
  (the encoder and the first decoder step; a later step with a beam reorder), split by whose line asked:
  the plugin's, fairseq's, the caller's;
* ``update syncs``: the host-device syncs of one whole update as fairseq-train runs it, fairseq's
  ``Trainer.train_step`` (forward, loss, backward, gradient norm, optimizer, the trainer's logging), in fp32 and
  under ``--amp --amp-dtype bfloat16``, after a first update (lazy state built): fairseq's own checks and
  logging included, which the training-step count leaves out.

    python -m benchmarks op-counts [--json out.json] [--archs umst,prime]
"""
import argparse
import json

import torch
import torch.nn.functional as F

from benchmarks import harness
from umst_dev import dev
from umst_dev.op_counts import HostSyncs, MatmulDtypes

def loss_of(model, sample):
    logits = model(**dev.model_inputs(model, sample))[0]
    pad = model.decoder.dictionary.pad()
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), sample["target"].view(-1), ignore_index=pad)


def backward_matmuls(model, sample, dtype=torch.bfloat16, device_type="cpu"):
    """(fp32-only, total) matrix products of one backward pass under autocast."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = loss_of(model, sample)
    with MatmulDtypes() as counter:
        loss.backward()
    return counter.fp32_only, counter.total, dict(counter.by_op)


def training_syncs(model, sample):
    model.zero_grad(set_to_none=True)
    with HostSyncs() as counter:
        loss_of(model, sample).backward()
    return counter


def decoding_syncs(model, sample, beam=2):
    """(first step incl. the encoder, a later step incl. the beam reorder) HostSyncs."""
    bsz = sample["net_input"]["src_tokens"].size(0)
    eos = model.decoder.dictionary.eos()
    device = sample["net_input"]["src_tokens"].device
    order = torch.arange(bsz, device=device).repeat_interleave(beam)
    with torch.no_grad(), HostSyncs() as counter:  # one counter: host tensors made in step 1 stay known
        enc = model.encoder.reorder_encoder_out(model.encoder(**dev.encoder_inputs(model, sample)), order)
        state = {}
        tokens = torch.full((bsz * beam, 1), eos, dtype=torch.long, device=device)
        model.decoder(tokens, encoder_out=enc, incremental_state=state)
        first = counter.snapshot()
        reorder = torch.arange(bsz * beam, device=device).flip(0)
        model.decoder.reorder_incremental_state_scripting(state, reorder)
        enc = model.encoder.reorder_encoder_out(enc, reorder)
        tokens = torch.cat([tokens, torch.full_like(tokens, 5)], dim=1)
        model.decoder(tokens, encoder_out=enc, incremental_state=state)
        later = counter.snapshot()
    return first, later


UPDATE_PRECISIONS = ("fp32", "bf16")


def update_syncs(name, precision, device="cpu"):
    """HostSyncs of one ``Trainer.train_step`` of row ``name`` (``bench_launches``' trainer: the plugin loaded, its
    task, a smoke run's sizes), the second update of the trainer."""
    from benchmarks import bench_launches

    row = bench_launches.launch_rows()[name]
    trainer, sample = bench_launches.build_trainer(row["arch"], row["overrides"], precision, True,
                                                   row.get("quick") or True, device=device)
    trainer.train_step([sample])
    with HostSyncs() as counter:
        trainer.train_step([sample])
    return counter


def measure(name, device="cpu"):
    arch, model, task = harness.build(name, vocab=200)
    model.to(device)
    sample = dev.move_sample(dev.random_sample(task, 8, 12, 12, seed=1), device)
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    model.eval()  # dropout off: torch's SDPA takes its fused bf16 CPU kernel (module docstring)
    fp32_bwd_no_dropout, _, _ = backward_matmuls(model, sample, device_type=device_type)
    model.train()
    fp32_bwd, total_bwd, by_op = backward_matmuls(model, sample, device_type=device_type)
    train = training_syncs(model, sample)
    model.eval()
    first, later = decoding_syncs(model, sample)
    updates = {p: update_syncs(name, p, device) for p in UPDATE_PRECISIONS}
    return dict(name=name, arch=arch, fp32_backward_matmuls=fp32_bwd, backward_matmuls=total_bwd,
                fp32_backward_matmuls_no_dropout=fp32_bwd_no_dropout,
                fp32_backward_by_op=by_op, train_syncs=dict(train.by_owner()),
                train_sync_lines=dict(train.locations), decode_first_syncs=dict(first.by_owner()),
                decode_later_syncs=dict(later.by_owner()),
                decode_sync_lines={"first": dict(first.locations), "later": dict(later.locations)},
                update_syncs={p: dict(c.by_owner()) for p, c in updates.items()},
                update_sync_lines={p: dict(c.locations) for p, c in updates.items()})


def markdown(rows):
    def split(c):
        return f"{c.get('plugin', 0)} / {c.get('fairseq', 0)}"
    lines = ["| arch | fp32-only backward matmuls (of all) | the same, dropout off | syncs per training step "
             "(plugin / fairseq) | first decoding step | later decoding step | whole update, fp32 | whole update, bf16 "
             "`--amp` |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arch']} | {r['fp32_backward_matmuls']} ({r['backward_matmuls']}) | "
                     f"{r['fp32_backward_matmuls_no_dropout']} | "
                     f"{split(r['train_syncs'])} | {split(r['decode_first_syncs'])} | {split(r['decode_later_syncs'])} | "
                     + " | ".join(split(r["update_syncs"][p]) for p in UPDATE_PRECISIONS) + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--archs", default=None, help="comma-separated rows (default: the transformer and every "
                                                 "family's measured row)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", default=None, help="also write the table here")
    p.add_argument("--lines", action="store_true", help="also print each sync's file:line")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    names = args.archs.split(",") if args.archs else harness.measured_rows()
    rows = [measure(n, args.device) for n in names]
    print(markdown(rows))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows) + "\n")
    if args.lines:
        for r in rows:
            print(f"\n{r['arch']}: training {r['train_sync_lines']}\n  decoding {r['decode_sync_lines']}\n"
                  f"  whole update {r['update_sync_lines']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, device=args.device, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
