"""Reusable model checks, applied to every architecture listed in test_model_checks.ARCH_CASES.

Each check builds the arch with tiny overrides through fairseq's real argument
parsing (umst_dev.dev.build_model) and feeds it batches collated by the
task's own dataset classes.
"""
import gc
import os
import socket
import tempfile
import traceback

import torch
import torch.nn.functional as F

from umst_dev import dev


def _eval_model(arch, overrides, device="cpu", task="multiscale_translation"):
    model, task_obj = dev.build_model(arch, overrides, task=task)
    return model.to(device).eval(), task_obj


def _rows_by_id(sample):
    return {int(i): b for b, i in enumerate(sample["id"])}


def _encoder_real_mask(enc, src_tokens, pad):
    """T_enc x B, True at the encoder output's real positions: from the encoder's own padding mask
    (its output need not be aligned with the source tokens, e.g. a character-level encoder), else
    from the source tokens."""
    masks = enc.get("encoder_padding_mask") or []
    if masks and masks[0] is not None and masks[0].numel():
        return ~masks[0].t()
    return src_tokens.ne(pad).t()


def check_padding_invariance(arch, overrides, left_pad_source, device="cpu", atol=1e-5):
    """Each sentence's encoder and decoder outputs alone == inside a padded batch."""
    model, task = _eval_model(arch, overrides, device)
    pad = task.source_dictionary.pad()
    dataset = dev.random_dataset(task, 6, src_len=12, tgt_len=9, seed=3, left_pad_source=left_pad_source)
    batch = dev.move_sample(dev.collate(dataset, range(6), pad_source_to=17), device)  # extra padding too
    with torch.no_grad():
        enc_out = model.encoder(**dev.encoder_inputs(model, batch))
        enc = enc_out["encoder_out"][0]
        real = _encoder_real_mask(enc_out, batch["net_input"]["src_tokens"], pad)
        dec = model(**dev.model_inputs(model, batch))[0]
        rows = _rows_by_id(batch)
        for i in range(6):
            alone = dev.move_sample(dev.collate(dataset, [i]), device)
            alone_out = model.encoder(**dev.encoder_inputs(model, alone))
            alone_real = _encoder_real_mask(alone_out, alone["net_input"]["src_tokens"], pad)[:, 0]
            enc_alone = alone_out["encoder_out"][0][alone_real, 0]
            dec_alone = model(**dev.model_inputs(model, alone))[0][0]
            b = rows[i]
            torch.testing.assert_close(enc[real[:, b], b], enc_alone, atol=atol, rtol=1e-4,
                                       msg=lambda m: f"{arch}: encoder output of sentence {i} changes with its batch/padding: {m}")
            tgt_len = int(alone["target"].ne(pad).sum())
            torch.testing.assert_close(dec[b, :tgt_len], dec_alone[:tgt_len], atol=atol, rtol=1e-4,
                                       msg=lambda m: f"{arch}: decoder output of sentence {i} changes with its batch/padding: {m}")


def check_incremental_decoding(arch, overrides, device="cpu", atol=1e-5):
    """Step-by-step decoding (with a beam reorder half way) == one teacher-forced pass."""
    model, task = _eval_model(arch, overrides, device)
    sample = dev.move_sample(dev.random_sample(task, 4, src_len=10, tgt_len=8, seed=5), device)
    prev = sample["net_input"]["prev_output_tokens"]
    pad = task.target_dictionary.pad()
    with torch.no_grad():
        enc = model.encoder(**dev.encoder_inputs(model, sample))
        full = model.decoder(prev, encoder_out=enc)[0]
        order = torch.tensor([2, 0, 3, 1, 1], device=prev.device)  # permute and duplicate, like a beam
        incremental_state = {}
        steps = prev.size(1)
        for t in range(steps):
            if t == steps // 2:
                model.decoder.reorder_incremental_state_scripting(incremental_state, order)
                enc = model.encoder.reorder_encoder_out(enc, order)
                prev, full = prev[order], full[order]
            out = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=incremental_state)[0][:, -1]
            real = prev[:, : t + 1].ne(pad).all(dim=1)  # rows whose prefix has no padding
            torch.testing.assert_close(out[real], full[real, t], atol=atol, rtol=1e-4,
                                       msg=lambda m: f"{arch}: incremental step {t} differs from full decoding: {m}")


def _loss(model, sample):
    logits = model(**dev.model_inputs(model, sample))[0]
    pad = model.decoder.dictionary.pad() if hasattr(model.decoder, "dictionary") else 1
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), sample["target"].reshape(-1),
                           ignore_index=pad)


def check_every_parameter_gets_gradient(arch, overrides, device="cpu"):
    model, task = dev.build_model(arch, overrides)
    model.to(device).train()
    sample = dev.move_sample(dev.random_sample(task, 4, src_len=10, tgt_len=8, seed=7), device)
    _loss(model, sample).backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"{arch}: parameters without gradient: {missing}"
    zero = [n for n, p in model.named_parameters() if p.requires_grad and not p.grad.abs().sum() > 0]
    assert not zero, f"{arch}: parameters whose gradient is all zero: {zero}"
    bad = [n for n, p in model.named_parameters() if p.requires_grad and not torch.isfinite(p.grad).all()]
    assert not bad, f"{arch}: non-finite gradients: {bad}"


def check_parameters_defined_on_construction(arch, overrides, task="multiscale_translation"):
    """Every parameter and buffer is initialized, not leftover allocator memory: the blocks of a
    first build are refilled with NaN and freed, so a second build that skipped an init would get
    them back (the CPU allocator reuses freed blocks of the same size)."""
    model, _ = dev.build_model(arch, overrides, task=task)
    shapes = [t.shape for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point()]
    del model
    poison = [torch.full(shape, float("nan")) for shape in shapes]
    del poison
    model, _ = dev.build_model(arch, overrides, task=task)
    bad = [n for n, t in list(model.named_parameters()) + list(model.named_buffers())
           if t.is_floating_point() and not torch.isfinite(t).all()]
    assert not bad, f"{arch}: uninitialized (non-finite) tensors after construction: {bad}"


# Every dropout an arch has, on for check_dropout_off_in_eval: fairseq's three, and Prime's own (its convolution's
# weights, its input); a dropout left at 0 would pass the check whatever its training flag.
DROPOUTS = dict(dropout=0.3, attention_dropout=0.3, activation_dropout=0.3)
OWN_DROPOUTS = {"prime": dict(prime_conv_weight_dropout=0.3, input_dropout=0.3)}


def check_dropout_off_in_eval(arch, overrides, device="cpu"):
    """Two eval passes are identical (no dropout left on), two train passes differ."""
    own = next((d for family, d in OWN_DROPOUTS.items() if arch.startswith(family + "_")), {})
    overrides = {**overrides, **DROPOUTS, **own}
    model, task = _eval_model(arch, overrides, device)
    sample = dev.move_sample(dev.random_sample(task, 3, src_len=10, tgt_len=8, seed=9), device)
    with torch.no_grad():
        a = model(**dev.model_inputs(model, sample))[0]
        b = model(**dev.model_inputs(model, sample))[0]
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=lambda m: f"{arch}: eval is not deterministic: {m}")
        model.train()
        c = model(**dev.model_inputs(model, sample))[0]
        d = model(**dev.model_inputs(model, sample))[0]
    assert not torch.equal(c, d), f"{arch}: dropout has no effect in training mode"


def check_low_precision(arch, overrides, dtype, device="cpu"):
    """fp16/bf16 forward and backward on a padded batch: finite everywhere that matters."""
    model, task = dev.build_model(arch, overrides)
    model.to(device=device, dtype=dtype).train()
    sample = dev.move_sample(dev.collate(dev.random_dataset(task, 5, 12, 9, seed=11), range(5), pad_source_to=16),
                             device)
    enc = model.encoder(**dev.encoder_inputs(model, sample))
    pad = task.source_dictionary.pad()
    real = _encoder_real_mask(enc, sample["net_input"]["src_tokens"], pad)  # T_enc x B
    assert torch.isfinite(enc["encoder_out"][0][real]).all(), f"{arch}: non-finite encoder output in {dtype}"
    loss = _loss(model, sample)
    assert torch.isfinite(loss), f"{arch}: non-finite loss in {dtype}"
    loss.backward()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"{arch}: non-finite {dtype} gradients: {bad}"


def _fixed_length_hypotheses(model, task, sample, beam=3, length=6):
    """Incremental beam search forced to ``length`` tokens + </s> (min_len = max_len), so that any two
    precisions emit hypotheses of the same shape whatever the scores rank first."""
    from fairseq.sequence_generator import SequenceGenerator

    generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=0, max_len_b=length,
                                  min_len=length)
    with torch.no_grad():
        return task.inference_step(generator, [model], sample)  # strips side inputs the encoder does not take


def check_autocast(arch, overrides, dtype, device="cpu", loss_rtol=0.05):
    """Mixed precision the way ``--amp --amp-dtype`` runs it: fp32 weights, every op under
    ``torch.autocast(device, dtype)``. On a padded batch, a train step gives a finite loss (within
    ``loss_rtol`` of fp32's), finite encoder output at real positions and finite fp32 gradients; incremental
    beam decoding gives finite scores and the same hypothesis shapes as in fp32."""
    model, task = dev.build_model(arch, overrides)
    model.to(device).train()
    sample = dev.move_sample(dev.collate(dev.random_dataset(task, 5, 12, 9, seed=11), range(5), pad_source_to=16),
                             device)
    pad = task.source_dictionary.pad()
    with torch.no_grad():
        torch.manual_seed(0)
        model.eval()
        fp32_loss = _loss(model, sample)
        model.train()
    with torch.autocast(device, dtype=dtype):
        enc = model.encoder(**dev.encoder_inputs(model, sample))
        real = _encoder_real_mask(enc, sample["net_input"]["src_tokens"], pad)  # T_enc x B
        assert torch.isfinite(enc["encoder_out"][0][real]).all(), f"{arch}: non-finite encoder output under {dtype} autocast"
        model.eval()  # dropout off: compare with fp32 on the same function, gradients still flow
        loss = _loss(model, sample)
    assert torch.isfinite(loss), f"{arch}: non-finite loss under {dtype} autocast"
    assert abs(loss.item() - fp32_loss.item()) <= loss_rtol * abs(fp32_loss.item()), \
        f"{arch}: {dtype} autocast loss {loss.item():.4f} vs fp32 {fp32_loss.item():.4f}"
    loss.backward()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"{arch}: non-finite gradients under {dtype} autocast: {bad}"
    not_fp32 = [n for n, p in model.named_parameters() if p.grad is not None and p.grad.dtype != torch.float32]
    assert not not_fp32, f"{arch}: master weights must get fp32 gradients under autocast: {not_fp32}"

    reference = _fixed_length_hypotheses(model, task, sample)
    with torch.autocast(device, dtype=dtype):
        hyps = _fixed_length_hypotheses(model, task, sample)
    for i, (ref_beam, beam) in enumerate(zip(reference, hyps)):
        assert [h["tokens"].shape for h in beam] == [h["tokens"].shape for h in ref_beam], \
            f"{arch}: {dtype} autocast hypothesis shapes of sentence {i} differ from fp32's"
        for h in beam:
            assert torch.isfinite(h["positional_scores"]).all() and torch.isfinite(h["score"]), \
                f"{arch}: non-finite beam scores under {dtype} autocast (sentence {i})"


def check_backward_in_autocast_dtype(arch, overrides, dtype=torch.bfloat16, device="cpu", grad_rtol=0.05):
    """Under ``torch.autocast(dtype)`` (dropout off, so that it compares with fp32 on the same function) no
    matrix product of the backward pass has only float32 inputs (custom autograd functions included:
    umst_plugin/modules/common/amp_functions.py), and the gradients equal fp32's within ``grad_rtol`` (relative norm
    of the difference over all parameters)."""
    from umst_dev.op_counts import MatmulDtypes

    model, task = dev.build_model(arch, overrides)
    model.to(device).eval()
    sample = dev.move_sample(dev.collate(dev.random_dataset(task, 5, 12, 9, seed=11), range(5), pad_source_to=16),
                             device)
    _loss(model, sample).backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=dtype):
        loss = _loss(model, sample)
    with MatmulDtypes() as counter:
        loss.backward()
    assert counter.total > 0
    assert counter.fp32_only == 0, \
        f"{arch}: {counter.fp32_only} of {counter.total} backward matmuls ran in fp32 under {dtype} autocast: " \
        f"{dict(counter.by_op)}"
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == reference.keys()
    diff = torch.sqrt(sum(((got[n] - reference[n]).double() ** 2).sum() for n in got))
    norm = torch.sqrt(sum((reference[n].double() ** 2).sum() for n in got))
    assert diff <= grad_rtol * norm, f"{arch}: {dtype} autocast gradients differ from fp32's by {diff / norm:.3f}"


class KeywordSeen:
    """The keyword argument ``name`` each module of ``modules`` was called with, in call order (``seen``), while
    the context is open: what a layer's caller handed it (a padding mask, say)."""

    def __init__(self, modules, name):
        self.modules, self.name, self.seen = list(modules), name, []

    def __enter__(self):
        self.hooks = [m.register_forward_pre_hook(lambda module, args, kwargs: self.seen.append(kwargs.get(self.name)),
                                                  with_kwargs=True) for m in self.modules]
        return self

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        return False


def check_no_plugin_host_syncs(arch, overrides, device="cpu"):
    """No host-device sync from the plugin's own lines (umst_dev/op_counts.py) in a training step (forward,
    loss, backward) nor in incremental decoding (the encoder and a first decoder step; a beam reorder and a
    later step), on a batch collated by the task's dataset (its host-side hints included)."""
    from umst_dev.op_counts import HostSyncs

    model, task = dev.build_model(arch, overrides)
    model.to(device).train()
    sample = dev.move_sample(dev.collate(dev.random_dataset(task, 5, 12, 9, seed=11), range(5), pad_source_to=16),
                             device)
    with HostSyncs() as counter:
        _loss(model, sample).backward()
    assert not counter.plugin_lines(), f"{arch}: host syncs in a training step: {counter.plugin_lines()}"
    model.eval()
    bsz, beam = 5, 2
    order = torch.arange(bsz, device=device).repeat_interleave(beam)
    eos = task.target_dictionary.eos()
    with torch.no_grad(), HostSyncs() as counter:
        enc = model.encoder.reorder_encoder_out(model.encoder(**dev.encoder_inputs(model, sample)), order)
        state = {}
        tokens = torch.full((bsz * beam, 1), eos, dtype=torch.long, device=device)
        model.decoder(tokens, encoder_out=enc, incremental_state=state)
        reorder = torch.arange(bsz * beam, device=device).flip(0)
        model.decoder.reorder_incremental_state_scripting(state, reorder)
        enc = model.encoder.reorder_encoder_out(enc, reorder)
        model.decoder(torch.cat([tokens, torch.full_like(tokens, 5)], dim=1), encoder_out=enc, incremental_state=state)
    assert not counter.plugin_lines(), f"{arch}: host syncs in incremental decoding: {counter.plugin_lines()}"


# ---- DistributedDataParallel --------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_steps(rank, arch, overrides):
    model, task = dev.build_model(arch, overrides, seed=0)
    ddp = torch.nn.parallel.DistributedDataParallel(model.train(), find_unused_parameters=False)
    for step in range(2):  # unused parameters only raise on the step after the first backward
        sample = dev.random_sample(task, 3, src_len=9, tgt_len=7, seed=100 * rank + step)
        logits = ddp(**dev.model_inputs(model, sample))[0]
        F.cross_entropy(logits.reshape(-1, logits.size(-1)), sample["target"].reshape(-1),
                        ignore_index=task.target_dictionary.pad()).backward()
    # DDP sits in a reference cycle: collected here, while the group is alive, not by the cyclic GC later
    del ddp, model
    gc.collect()


def _ddp_worker(rank, world_size, port, cases, out_dir):
    """Every case in one pair of processes (starting two Pythons with torch, fairseq and the plugin costs far
    more than a tiny model's two steps). A case that fails writes its traceback and the next one runs; a
    collective that one rank never reaches times out (the group's timeout) instead of hanging."""
    import datetime

    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world_size, timeout=datetime.timedelta(seconds=120))
    for case, arch, overrides in cases:
        try:
            _ddp_steps(rank, arch, overrides)
            torch.distributed.barrier()
            open(os.path.join(out_dir, f"{case}.rank{rank}.ok"), "w").close()
        except BaseException:
            with open(os.path.join(out_dir, f"{case}.rank{rank}.err"), "w") as f:
                f.write(traceback.format_exc())
    # Tear the gloo group down while the interpreter is fully alive: gloo's destructor run during interpreter
    # shutdown can abort the process ("terminate called without an active exception", SIGABRT: seen once in
    # CI). The barrier keeps one rank from tearing down while the other is still in a collective.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def check_ddp_cases(cases, world_size=2):
    """DistributedDataParallel over gloo, ``world_size`` processes on this machine, two forward/backward steps of
    each ``(case, arch, overrides)``: case -> None where every rank passed, else the ranks' tracebacks."""
    with tempfile.TemporaryDirectory() as out_dir:
        spawn_error = None
        try:
            torch.multiprocessing.spawn(_ddp_worker, args=(world_size, _free_port(), list(cases), out_dir),
                                        nprocs=world_size, join=True)
        except Exception as e:  # noqa: BLE001 -- reported with the cases it left without a result
            spawn_error = f"the DDP processes failed: {e}"
        results = {}
        for case, arch, _ in cases:
            marks = [os.path.join(out_dir, f"{case}.rank{r}") for r in range(world_size)]
            if all(os.path.exists(m + ".ok") for m in marks):
                results[case] = None
                continue
            errors = [open(m + ".err").read() for m in marks if os.path.exists(m + ".err")]
            results[case] = f"{arch}: DDP forward/backward failed\n" + ("\n".join(errors) or spawn_error or "no result")
        return results
