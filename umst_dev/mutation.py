"""The mutation check: faults planted one at a time in the code under test, each run against the tests that claim
to guard it. A fault that no test catches is a test missing (or one that cannot fail).

    python -m umst_dev.mutation                     # every fault in MUTANTS
    python -m umst_dev.mutation --only NAME [NAME]  # some of them
    python -m umst_dev.mutation --list              # the table
    python -m umst_dev.mutation --json docs/results/mutation-cpu.json --markdown docs/results/mutation-cpu.md
    python -m umst_dev.mutation --update docs/results/mutation-cpu.json   # the faults the record lacks, merged in

A fault is a text patch of one file: a snippet that occurs exactly once in it, and what replaces it (or several,
planted together: ``Mutant.also``, the same change to a formula's reference path and its faster twin). The check
copies the repository's files (``git ls-files``: tracked, and untracked ones git does not ignore) into a temporary
directory and works there only: the guarding tests run once on the unchanged copy (they must pass, or a caught
fault would mean nothing), then for each fault the copy's file is rewritten, its tests run (``pytest -n 0 -x``,
the copy first on ``PYTHONPATH``, no bytecode written), and the original text is put back before the next. The
checkout is never written; the copy is removed at the end, after an error or Ctrl-C too.

A fault is *caught* when its tests fail (pytest's status 1), *survived* when they pass; a run that cannot collect
its tests (status 2-5) or runs out of time is reported as such. The exit status is 1 if any fault survived or
could not be judged.

The paths of the code under test are written in one place, :data:`FILES` (a module that moves is changed there).
``tests/test_mutation_table.py`` checks, in the suite, that every snippet still occurs exactly once and that the
tests named exist; the last full run is recorded in ``docs/results/mutation-cpu.json``.

``--update RECORD`` runs the faults the record lacks (or those of ``--only``) and writes them into it, in the
table's order, with the faults no longer in the table left out: a new fault is checked without running the whole
table again. Each result run so is marked with its own commit, start and machine (the record's header keeps the
full run's), and the markdown table names the commit beside a result that ran on another.
"""
import argparse
import contextlib
import dataclasses
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The code under test, by role: every mutant names one of these keys.
FILES = {
    "fused_adam": "umst_plugin/training/fused_adam.py",
    "resume_batch_order": "umst_plugin/patches/resume_batch_order.py",
    "broadcast_checkpoint_load": "umst_plugin/patches/broadcast_checkpoint_load.py",
    "partition_symbols": "umst_plugin/patches/partition_symbols.py",
    "compile": "umst_plugin/compilation/dispatch.py",
    "compile_retry": "umst_plugin/compilation/retry.py",
    "prime_dynamic_conv": "umst_plugin/modules/prime/dynamic_conv.py",
    "prime_layer": "umst_plugin/modules/prime/layer.py",
    "umst_graphs": "umst_plugin/modules/umst/graphs.py",
    "transformer_sf_fusion": "umst_plugin/modules/transformer_sf/fusion.py",
    "msmsa_window_bias": "umst_plugin/modules/msmsa/window_bias.py",
    "msmsa_windowed_attention": "umst_plugin/modules/msmsa/windowed_attention.py",
    "train_sh": "scripts/train.sh",
    "forked_cli": "tests/forked_cli.py",
    "umst_attention": "umst_plugin/modules/umst/rectified_attention.py",
    "compiled_loss": "umst_plugin/compilation/loss.py",
    "saved_activation_strides": "umst_plugin/patches/saved_activation_strides.py",
    "transformer_sf_attention": "umst_plugin/modules/transformer_sf/fast_attention.py",
    "msc_layer": "umst_plugin/modules/msc/layer.py",
    "amp_weights": "umst_plugin/amp_weights.py",
    "side_files": "umst_plugin/data/side_files.py",
    "conllu_reader": "umst_plugin/preprocess/conllu_reader.py",
    "significance": "umst_tools/multi30k/significance.py",
    "preemption": "umst_plugin/training/preemption.py",
    "grad_norm": "umst_plugin/training/grad_norm.py",
    "word_boundaries": "umst_plugin/data/word_boundaries.py",
    "msc_decoder": "umst_plugin/models/msc/decoder.py",
    "msc_encoder": "umst_plugin/models/msc/encoder.py",
    "umst_encoder": "umst_plugin/models/umst/encoder.py",
    "msc_lean": "umst_plugin/modules/msc/lean.py",
    "prime_multi_kernel_conv": "umst_plugin/modules/prime/multi_kernel_conv.py",
    "average_checkpoints": "umst_plugin/average_checkpoints.py",
    "score": "umst_tools/score.py",
    "spacy_backend": "umst_plugin/preprocess/spacy_backend.py",
    "group_gcn": "umst_plugin/modules/common/group_gcn.py",
    "msmsa_layer": "umst_plugin/modules/msmsa/layer.py",
    "side_inputs": "umst_plugin/data/side_inputs.py",
    "common_attention": "umst_plugin/modules/common/attention.py",
    "msc_grad_norms": "umst_plugin/modules/msc/grad_norms.py",
    "msc_model": "umst_plugin/models/msc/model.py",
    "prime_config": "umst_plugin/models/prime/config.py",
    "transformer_sf_lean": "umst_plugin/modules/transformer_sf/lean.py",
    "side_data_dataset": "umst_plugin/data/side_data_dataset.py",
    "speed_table": "benchmarks/speed_table.py",
    "text_preprocessing": "umst_plugin/text_preprocessing.py",
    "bench_harness": "benchmarks/harness.py",
    "graph_shapes": "umst_plugin/compilation/graph_shapes.py",
    "encoder_padding_mask": "umst_plugin/patches/encoder_padding_mask.py",
    "decoder_padding_mask": "umst_plugin/patches/decoder_padding_mask.py",
    "lightconv_conv_bias": "umst_plugin/patches/lightconv_conv_bias.py",
    "checkpoint_precision": "umst_plugin/patches/checkpoint_precision.py",
    "task_autocast": "umst_plugin/patches/task_autocast.py",
    "pair_dataset_sizes": "umst_plugin/patches/pair_dataset_sizes.py",
    "transformer_sf_layer": "umst_plugin/modules/transformer_sf/layer.py",
    "transformer_sf_char_table": "umst_plugin/modules/transformer_sf/char_table.py",
    "transformer_sf_config": "umst_plugin/models/transformer_sf/config.py",
    "transformer_sf_encoder": "umst_plugin/models/transformer_sf/encoder.py",
    "umst_layer": "umst_plugin/modules/umst/layer.py",
    "task": "umst_plugin/tasks/multiscale_translation.py",
    "compile_cache": "umst_plugin/compilation/cache.py",
    "preprocess_chunks": "umst_plugin/preprocess/chunks.py",
    "preprocess_sidefiles": "umst_plugin/preprocess/sidefiles.py",
    "preprocess_cli": "umst_plugin/preprocess/cli.py",
    "preprocess_text": "umst_plugin/preprocess/text.py",
    "hub": "umst_plugin/hub.py",
    "umst_lean_gcn": "umst_plugin/modules/umst/lean_gcn.py",
}


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # a key of FILES
    original: str  # occurs exactly once in the file
    faulty: str
    tests: tuple  # pytest arguments: test files or node ids (tests/...), options such as -m "not slow"
    fault: str  # what the fault does, in words
    # more (snippet, fault) pairs of the same file, planted together with the first: the same change made to every
    # path that computes one formula (a reference path and its faster twin), which their equivalence tests cannot see
    also: tuple = ()

    def replacements(self):
        return ((self.original, self.faulty),) + tuple(self.also)


NOT_SLOW = ("-m", "not slow")
MSC_LAYER_ALONE = ("tests/test_msc_lean.py::"
                   "test_a_layer_called_alone_builds_its_masks_and_keys_and_equals_its_reference_form")

MUTANTS = (
    Mutant("adam-eps-placement", "fused_adam",
           "weight_decay=weight_decay * lr / step_size if step_size else 0.0, eps=eps,",
           "weight_decay=weight_decay * lr / step_size if step_size else 0.0, eps=eps * math.sqrt(1 - beta2 ** t),",
           ("tests/test_fused_update.py::test_step_sizes_are_fairseqs_with_a_large_eps",
            "tests/test_fused_update.py::test_same_update_as_fairseqs_adam"),
           "the fused update's eps added after the bias correction (torch's placement, not fairseq's)"),
    Mutant("adam-eps-placement-amp", "fused_adam",
           "weight_decay=0.0, eps=eps, amsgrad=amsgrad, maximize=False, grad_scale=grad_scale,",
           "weight_decay=0.0, eps=eps * math.sqrt(1 - beta2), amsgrad=amsgrad, maximize=False, "
           "grad_scale=grad_scale,",
           ("tests/test_fused_update.py::test_fairseq_trainer_same_weights_as_old_adam",),
           "under --amp, the fused update's eps at torch's placement of step 1"),
    Mutant("resume-batch-order", "resume_batch_order",
           'arguments["epoch"] = 1', 'arguments["epoch"] = epoch',
           ("tests/test_patch_resume_batch_order.py",),
           "a run resumed in epoch 2 orders its examples with the resume epoch's seed (fairseq's bug back)"),
    Mutant("broadcast-load-allow-list", "broadcast_checkpoint_load",
           "with safe_globals(classes):", "with safe_globals([]):",
           ("tests/test_preemption.py::test_a_signal_to_one_rank_stops_every_rank_at_the_same_update",),
           "the other ranks' load of the broadcast checkpoint allows none of its classes"),
    Mutant("partition-symbols-retry", "partition_symbols",
           "saved_sym_nodes.extend(missing)  # the caller's list", "pass  # the caller's list",
           ("tests/test_compile.py::test_the_partition_patch_saves_the_size_inputs_a_split_left_out",),
           "torch 2.11's split retried without the size inputs it left out"),
    Mutant("compile-reuse-cache-identity", "compile",
           "if source is t and version == current and current is not None:",
           "if version == current and current is not None:",
           ("tests/test_compile.py::test_plain_copies_a_view_once_while_that_tensor_is_unchanged",),
           "a layer input's plain copy reused for another tensor of the same version"),
    Mutant("compile-reuse-cache-version", "compile",
           "if source is t and version == current and current is not None:",
           "if source is t and current is not None:",
           ("tests/test_compile.py::test_plain_copies_a_view_once_while_that_tensor_is_unchanged",),
           "a layer input's plain copy reused after the tensor changed in place"),
    Mutant("compile-copy-cut-from-autograd", "compile",
           "    if t.requires_grad:\n        return t.clone(memory_format=torch.contiguous_format)",
           "    if t.requires_grad:\n        return t.detach().clone(memory_format=torch.contiguous_format)",
           ("tests/test_compile.py::test_every_arch_falls_back_to_eager_where_its_layers_fail_to_compile",),
           "a compiled layer's copied input cut from autograd (no gradient flows back through it)"),
    Mutant("compile-backward-retry", "compile_retry",
           "except CompileFailure as failure:", "except ZeroDivisionError as failure:",
           ("tests/test_compile_stream.py::"
            "test_the_trainer_retries_an_update_whose_compiled_backward_failed_and_goes_on_eager",),
           "fairseq's Trainer does not retry an update whose compiled backward failed"),
    Mutant("prime-dynamic-conv-window", "prime_dynamic_conv",
           "padded = F.pad(x, (0, 0, 0, 0, padding_l, K - 1 - padding_l)).view(T + K - 1, B, H, C // H)\n"
           "        out = (_laid_out(",
           "padded = F.pad(x, (0, 0, 0, 0, padding_l + 1, K - 2 - padding_l)).view(T + K - 1, B, H, C // H)\n"
           "        out = (_laid_out(",
           ("tests/test_dynamic_conv.py",),
           "the dynamic convolution's window one step to the left"),
    Mutant("prime-dynamic-conv-cell-offsets", "prime_dynamic_conv",
           "return left + right + 1, left, [left - p for p in paddings]",
           "return left + right + 1, left, [0 for p in paddings]",
           ("tests/test_dynamic_conv.py",),
           "every cell's taps at the start of the combined window (Eq. 7's narrower cells misplaced)"),
    Mutant("prime-batched-projection-gradient", "prime_layer",
           "grad_weight = torch.bmm(_stack_chunks(branches, chunks).transpose(1, 2), grad) if need[0] else None",
           "grad_weight = 0.5 * torch.bmm(_stack_chunks(branches, chunks).transpose(1, 2), grad) if need[0] "
           "else None",
           ("tests/test_prime_lean.py::test_batched_output_projection_under_bf16_autocast",),
           "the batched output projection's weight gradient halved"),
    Mutant("umst-word-pooling", "umst_graphs",
           'down = mean if downsample == "mean" else onehot * inv.sqrt()',
           'down = onehot if downsample == "mean" else onehot * inv.sqrt()',
           (*NOT_SLOW, "tests/test_umst.py", "tests/test_umst_lean.py"),
           "subwords pooled to words by their sum, not their mean (the layers' dense operator)"),
    Mutant("umst-word-pooling-index", "umst_graphs",
           'out = sums / n if mode == "mean" else sums / n.sqrt()',
           'out = sums if mode == "mean" else sums / n.sqrt()',
           (*NOT_SLOW, "tests/test_umst.py", "tests/test_umst_lean.py"),
           "subwords pooled to words by their sum, not their mean (the index path)"),
    Mutant("transformer-sf-cross-attention-pad", "transformer_sf_fusion",
           "context = attention(q_ext, kv_ext, kv_ext, mask, dropout, scale=self.scaling)",
           "context = attention(q_ext, kv_ext, kv_ext, None, dropout, scale=self.scaling)",
           (*NOT_SLOW, "tests/test_transformer_sf.py", "tests/test_transformer_sf_lean.py"),
           "the cross-granularity attention (lean path) attends to the other branch's padding"),
    Mutant("transformer-sf-cross-attention-pad-fused", "transformer_sf_fusion",
           "keep = (~key_padding_mask).view(batch, 1, 1, -1)",
           "keep = torch.ones_like(key_padding_mask).view(batch, 1, 1, -1)",
           (*NOT_SLOW, "tests/test_transformer_sf.py", "tests/test_transformer_sf_lean.py"),
           "the cross-granularity attention (fused path) attends to the other branch's padding"),
    Mutant("msmsa-window-mask", "msmsa_window_bias",
           "inside = distance <= half[..., None]", "inside = distance < half[..., None]",
           (*NOT_SLOW, "tests/test_msmsa.py", "tests/test_msmsa_lean.py"),
           "every head's window (the stack's shared bias) one key narrower on each side"),
    Mutant("msmsa-window-mask-module", "msmsa_windowed_attention",
           "band = (offset >= -half) & (offset <= (0 if causal else half))",
           "band = (offset > -half) & (offset <= (0 if causal else half))",
           (*NOT_SLOW, "tests/test_msmsa.py", "tests/test_msmsa_lean.py"),
           "the windowed attention's own window bias one key narrower on the left"),
    Mutant("train-sh-nodes", "train_sh",
           "NEW_UF=$(( UF * ASSUMED / WORLD ))", "NEW_UF=$(( UF * ASSUMED / GPUS ))",
           ("tests/test_train_sh_plan.py::test_every_machine_uses_its_gpus_and_ranks_never_overlap",),
           "train.sh scales update_freq by the GPUs of one machine, not of all of them"),
    Mutant("train-sh-nodes-max-tokens", "train_sh",
           "NEW_UF=$(( TOKENS / (MAX_TOKENS * WORLD) ))", "NEW_UF=$(( TOKENS / (MAX_TOKENS * GPUS) ))",
           ("tests/test_train_sh_plan.py::test_max_tokens_keeps_the_tokens_per_update",),
           "with --max-tokens, train.sh scales update_freq by the GPUs of one machine, not of all of them"),
    Mutant("forked-cli-one-seed", "forked_cli",
           "SERVERS_PER_TOOL = 2", "SERVERS_PER_TOOL = 1",
           ("tests/test_forked_cli.py::test_forked_runs_hash_and_shut_down_as_fresh_processes",),
           "every forked run of a tool gets one string-hash seed (one server per tool)"),
    Mutant("forked-cli-seed-not-given", "forked_cli",
           "env=dict(env, PYTHONHASHSEED=str(seed))", "env=env",
           ("tests/test_forked_cli.py::test_forked_runs_hash_and_shut_down_as_fresh_processes",),
           "a server's hash seed drawn but not given to it (the seed a run reports is not its own)"),
    Mutant("forked-cli-finalization", "forked_cli",
           "raise SystemExit(code)  # the interpreter's own shutdown: threads joined, atexit, finalization",
           "import atexit; threading._shutdown(); atexit._run_exitfuncs(); sys.stdout.flush(); sys.stderr.flush(); "
           "os._exit(code)",
           ("tests/test_forked_cli.py::test_forked_runs_hash_and_shut_down_as_fresh_processes",),
           "a forked run exits after atexit without the interpreter's finalization (as before)"),
    Mutant("umst-rpr-direction", "umst_attention",
           "return (pos.unsqueeze(0) - pos.unsqueeze(1)).clamp(-max_distance, max_distance) + max_distance",
           "return (pos.unsqueeze(1) - pos.unsqueeze(0)).clamp(-max_distance, max_distance) + max_distance",
           (*NOT_SLOW, "tests/test_umst.py", "tests/test_umst_lean.py"),
           "Shaw et al.'s relative position of key j for query i taken as i - j, not j - i"),
    Mutant("umst-rpr-clip", "umst_attention",
           "return (pos.unsqueeze(0) - pos.unsqueeze(1)).clamp(-max_distance, max_distance) + max_distance",
           "return (pos.unsqueeze(0) - pos.unsqueeze(1)).clamp(1 - max_distance, max_distance - 1) + max_distance",
           (*NOT_SLOW, "tests/test_umst.py", "tests/test_umst_lean.py"),
           "relative positions clipped at k - 1, not k"),
    Mutant("umst-fused-average", "umst_attention",
           "return torch.baddbmm(a, up, w, beta=0.5, alpha=0.5)",
           "return torch.baddbmm(a, up, w, beta=0.5, alpha=1.0)",
           (*NOT_SLOW, "tests/test_umst.py", "tests/test_umst_lean.py"),
           "the word branch of the rectified attention added whole, not averaged with the subword branch (Eq. 5)"),
    Mutant("umst-phrase-self-loops", "umst_graphs",
           "adj = child_head | child_head.transpose(1, 2) | torch.diag_embed(valid)",
           "adj = child_head | child_head.transpose(1, 2)",
           (*NOT_SLOW, "tests/test_umst.py", "tests/test_umst_lean.py"),
           "the phrase graph without its self loops (A_p, not A_p + I)"),
    Mutant("umst-phrase-directed", "umst_graphs",
           "adj = child_head | child_head.transpose(1, 2) | torch.diag_embed(valid)",
           "adj = child_head | torch.diag_embed(valid)",
           (*NOT_SLOW, "tests/test_umst.py", "tests/test_umst_lean.py"),
           "the phrase graph directed (child to head only), not symmetric"),
    Mutant("umst-gcn-normalization", "umst_graphs",
           "inv_sqrt = adj.sum(-1, dtype=dtype).clamp(min=1).rsqrt()",
           "inv_sqrt = adj.sum(-1, dtype=dtype).clamp(min=1).reciprocal()",
           (*NOT_SLOW, "tests/test_umst.py", "tests/test_umst_lean.py"),
           "the phrase graph normalised by D^-1 on both sides, not D^-1/2"),
    Mutant("transformer-sf-boundary", "transformer_sf_attention",
           "        valid = valid & (key_groups == query_groups)\n",
           "        valid = valid\n",
           (*NOT_SLOW, "tests/test_transformer_sf.py", "tests/test_transformer_sf_lean.py"),
           "the fast branch's relative positions across word boundaries (vanilla RPR, not boundary-wise)"),
    Mutant("transformer-sf-band-end", "transformer_sf_attention",
           "in_range = (cols >= 0) & (cols < length)",
           "in_range = (cols >= 0) & (cols <= length)",
           (*NOT_SLOW, "tests/test_transformer_sf.py", "tests/test_transformer_sf_lean.py"),
           "a relative term for an offset past the last character (its clamped column read as a key)"),
    Mutant("msc-context-cell-state", "msc_layer",
           "new = self.gru(block_out.reshape(-1, shape[-1]), prev_context.reshape(-1, shape[-1]))",
           "new = self.gru(prev_context.reshape(-1, shape[-1]), block_out.reshape(-1, shape[-1]))",
           (*NOT_SLOW, "tests/test_msc.py", "tests/test_msc_lean.py"),
           "the context GRU's state is the block output and its input the previous context (Eq. 9 swapped)"),
    Mutant("amp-cache-unused-gradient", "amp_weights",
           "if id(p) in none_before and id(p) not in usage.used:",
           "if False:",
           ("tests/test_amp_weights.py",),
           "a cached parameter unused in an update keeps the zero gradient the concatenation gave it"),
    Mutant("amp-cache-function-inputs", "amp_weights",
           "return {ptr for ptr, reads in self.reads.items() if reads == [True]} - self.function_inputs",
           "return {ptr for ptr, reads in self.reads.items() if reads == [True]}",
           ("tests/test_amp_weights.py",),
           "parameters handed to a custom autograd function cast once too (their gradient rounded)"),
    Mutant("amp-cache-no-gradient", "amp_weights",
           "if p.untyped_storage().data_ptr() in storages & used]",
           "if p.untyped_storage().data_ptr() in storages]",
           ("tests/test_amp_weights.py",),
           "a parameter cast in the first update but given no gradient there cast once too (zeros, not None)"),
    Mutant("side-data-line", "side_files",
           "raise SideDataError(wid_path, i + 1,",
           "raise SideDataError(wid_path, i,",
           ("tests/test_side_data_errors.py",),
           "a word-id file's error names the 0-based line"),
    Mutant("conllu-line", "conllu_reader",
           "for line_no, raw in enumerate(f, start=1):",
           "for line_no, raw in enumerate(f):",
           ("tests/test_conllu_reader.py", "tests/test_side_data_errors.py"),
           "a CoNLL-U file's errors name 0-based lines"),
    Mutant("msmsa-relative-window", "msmsa_window_bias",
           "divisors.append(2 * scale.value)", "divisors.append(scale.value)",
           (*NOT_SLOW, "tests/test_msmsa.py", "tests/test_msmsa_lean.py"),
           "an N/k head's reach floor(n / k) on each side (the stack's shared bias), not floor(n / 2k)"),
    Mutant("msmsa-relative-window-module", "msmsa_windowed_attention",
           'return torch.div(lengths, 2 * self.value, rounding_mode="floor")',
           'return torch.div(lengths, self.value, rounding_mode="floor")',
           (*NOT_SLOW, "tests/test_msmsa.py", "tests/test_msmsa_lean.py"),
           "an N/k head's reach floor(n / k) on each side (the module's own bias), not floor(n / 2k)"),
    Mutant("significance-sign", "significance",
           "return round(result.score - baseline.score, 2), result.p_value",
           "return round(baseline.score - result.score, 2), result.p_value",
           ("tests/test_recipes.py::test_paired_bootstrap_against_the_baseline",),
           "the significance column's BLEU difference taken baseline minus row"),
    Mutant("preemption-signal-after-training", "preemption",
           "        return None\n    if not _received:",
           "        return _pass_on(signum, frame)\n    if not _received:",
           ("tests/test_preemption.py",),
           "a stop signal repeated after training ended kills the process with the signal's status"),
    Mutant("grad-norm-clip-up", "grad_norm",
           "clip_coef = (float(max_norm) / (norm + 1e-6)).clamp_(max=1)",
           "clip_coef = float(max_norm) / (norm + 1e-6)",
           ("tests/test_fused_update.py",),
           "gradients under --clip-norm scaled up to it, not only down"),
    Mutant("fused-adam-decay-lr", "fused_adam",
           "weight_decay=weight_decay * lr / step_size if step_size else 0.0, eps=eps,",
           "weight_decay=weight_decay / step_size if step_size else 0.0, eps=eps,",
           ("tests/test_fused_update.py::test_same_update_as_fairseqs_adam",),
           "the fused update's weight decay not scaled by the learning rate (fairseq's adam decays by lr x wd)"),
    Mutant("word-ids-eos", "word_boundaries",
           "new_word = (new_word | is_eos) & is_tok", "new_word = new_word & is_tok",
           ("tests/test_side_data.py",),
           "</s> joins the word of a piece before it that continues (subword-nmt's @@), not a word of its own"),
    Mutant("word-ids-sentencepiece-first", "word_boundaries",
           "        new_word |= first\n", "",
           ("tests/test_side_data.py",),
           "a sentencepiece row whose first piece has no word marker starts with word 0"),
    Mutant("prime-activation-dropout-in-eval", "prime_layer",
           "branches.append(F.dropout(hidden, p=self.activation_dropout, training=self.training))",
           "branches.append(F.dropout(hidden, p=self.activation_dropout, training=True))",
           ("tests/test_model_checks.py::test_dropout_off_in_eval",),
           "Prime's FFN activation dropout left on in evaluation"),
    Mutant("msc-beam-reorder", "msc_decoder",
           'cache["self"] = cache["self"].index_select(0, new_order)', 'cache["self"] = cache["self"]',
           (*NOT_SLOW, "tests/test_msc.py", "tests/test_msc_lean.py"),
           "MSC's decoder keeps its self-attention cache in the old order after a beam reorder"),
    Mutant("prime-conv-beam-reorder", "prime_multi_kernel_conv",
           'self.set_incremental_state(incremental_state, "input_buffer", buffer.index_select(1, new_order))',
           'self.set_incremental_state(incremental_state, "input_buffer", buffer)',
           ("tests/test_prime.py::test_beam_reorder_of_incremental_state",),
           "Prime's dynamic convolution (own projection) keeps its input buffer in the old order after a beam reorder"),
    Mutant("prime-standard-conv-beam-reorder", "prime_multi_kernel_conv",
           'state = {"input_buffer": state["input_buffer"].index_select(1, new_order)}',
           'state = {"input_buffer": state["input_buffer"]}',
           ("tests/test_prime.py::test_beam_reorder_of_incremental_state",),
           "Prime's standard convolution keeps its input buffer in the old order after a beam reorder"),
    Mutant("msc-gate-swapped", "msc_lean",
           "return torch.lerp(a_c, a_h, gate)", "return torch.lerp(a_h, a_c, gate)",
           (*NOT_SLOW, "tests/test_msc.py", "tests/test_msc_lean.py"),
           "MSC's fusion gate (lean path) weighs the context attention by g, not the hidden one (Eq. 12/13 swapped)"),
    Mutant("umst-half-sum-backward", "umst_attention",
           "return half, None, torch.bmm(up.transpose(1, 2), half)",
           "return grad, None, torch.bmm(up.transpose(1, 2), half)",
           (*NOT_SLOW, "tests/test_umst.py", "tests/test_umst_lean.py"),
           "the rectified attention's average passes the subword branch's gradient back whole, not halved"),
    Mutant("msmsa-head-rounding", "msmsa_windowed_attention",
           "bound = min(total, math.ceil(running - 1e-6))", "bound = min(total, math.floor(running + 1e-6))",
           (*NOT_SLOW, "tests/test_msmsa.py"),
           "MSMSA's heads per scale rounded down, not by the cumulative ceiling of the paper's worked example"),
    Mutant("average-checkpoints-mean", "average_checkpoints",
           "averaged[k] = (v / len(paths)).to(dtypes[k])", "averaged[k] = (v / max(len(paths) - 1, 1)).to(dtypes[k])",
           ("tests/test_recipes.py::test_average_checkpoints_averages_and_picks_the_newest",),
           "umst-average-checkpoints divides the sum by one checkpoint fewer than it read"),
    Mutant("average-checkpoints-newest", "average_checkpoints",
           "if newest is None or updates_of(state) > updates_of(newest):",
           "if newest is None or updates_of(state) < updates_of(newest):",
           ("tests/test_recipes.py::test_average_checkpoints_averages_and_picks_the_newest",),
           "the average carries the oldest input's training state, not the newest's"),
    Mutant("compound-split-references", "score",
           "hyps, refs = [compound_split(h) for h in hyps], [compound_split(r) for r in refs]",
           "hyps, refs = [compound_split(h) for h in hyps], refs",
           ("tests/test_recipes.py::test_compound_splitting_matches_the_perl_regex",
            "tests/test_recipes.py::test_compound_split_bleu_splits_hypotheses_and_references"),
           "the compound-split BLEU splits the hypotheses only, not the references"),
    Mutant("spacy-heads-0-based", "spacy_backend",
           "heads.append(0 if tok.head.i == tok.i else tok.head.i + 1)",
           "heads.append(0 if tok.head.i == tok.i else tok.head.i)",
           ("tests/test_parsers.py",),
           "spaCy's heads written 0-based (CoNLL-U's are 1-based, 0 the root)"),
    Mutant("group-gcn-second-product", "group_gcn",
           "        h = group_mean(h, group_ids, time_first=time_first, num_groups=num_groups)\n"
           "        return x + F.dropout(h, p=self.dropout, training=self.training)",
           "        return x + F.dropout(h, p=self.dropout, training=self.training)",
           ("tests/test_group_gcn.py",),
           "the same-group GCN block without Eq. 2's second multiplication by the normalised adjacency"),
    Mutant("transformer-sf-chars-to-tokens", "transformer_sf_fusion",
           "means = segment_mean(values, slot, batch * slots).view(batch, slots, channels)[:, 1:]",
           "means = segment_mean(values, slot, batch * slots).view(batch, slots, channels)[:, :-1]",
           (*NOT_SLOW, "tests/test_transformer_sf.py"),
           "a subword takes the characters' mean of the subword before it (the padding slot read as subword 1)"),
    Mutant("lean-group-gcn-residual-gradient", "transformer_sf_lean",
           "ln_weight, ln_bias, [need[0], need[1], need[2]])\n        grad_x = grad + grad_x.to(grad.dtype) if need[0] "
           "else None\n        return grad_x, grad_ln_weight, grad_ln_bias, grad_weight, grad_bias, None, None, None,",
           "ln_weight, ln_bias, [need[0], need[1], need[2]])\n        grad_x = grad_x.to(grad.dtype) if need[0] "
           "else None\n        return grad_x, grad_ln_weight, grad_ln_bias, grad_weight, grad_bias, None, None, None,",
           (*NOT_SLOW, "tests/test_transformer_sf_lean.py"),
           "the lean same-group GCN block's backward drops the residual's gradient"),
    Mutant("side-data-batch-order", "side_data_dataset",
           'ordered = [by_id[int(i)] for i in batch["id"]]', "ordered = samples",
           ("tests/test_side_data.py",),
           "a batch's word ids and heads collated in the order the samples came, not in the batch's length order"),
    Mutant("speed-table-warm-up", "speed_table",
           "words_per_s=round(statistics.median(wps[1:]), 1) if len(wps) > 1 else None,",
           "words_per_s=round(statistics.median(wps), 1) if len(wps) > 1 else None,",
           ("tests/test_speed_table.py::test_tiny_run_has_every_planned_row_with_its_fields",),
           "the speed table's words/s a median over every log interval, the first (start-up, compiling) included"),
    Mutant("text-lowercase", "text_preprocessing",
           "        if self.lowercase:\n            text = text.lower()\n", "",
           ("tests/test_inference.py",),
           "raw text is not lowercased where the data-bin's record says its text was"),
    Mutant("text-record-romanian-subset", "text_preprocessing",
           'if not set(data["normalisation"]["romanian"]) <= set(data["languages"]):',
           'if not set(data["normalisation"]["romanian"]) < set(data["languages"]):',
           ("tests/test_text_preprocessing.py",),
           "a preprocessing.json whose every language is Romanian-normalised (Romanian alone) refused as broken"),
    Mutant("text-record-write-defaults", "text_preprocessing",
           "def write_record(databin, languages, *, lowercase, aggressive_dash_splits=True, escape=True,",
           "def write_record(databin, languages, *, lowercase, aggressive_dash_splits=False, escape=True,",
           ("tests/test_text_preprocessing.py",),
           "a record written with the defaults says no aggressive dash splits, where the recipes' tokenizer.perl "
           "runs with -a"),
    Mutant("text-registry-name-fallback", "text_preprocessing",
           '    if name is None and not hasattr(cfg, "_name"):\n', "    if name is None:\n",
           ("tests/test_text_preprocessing.py",),
           "a fairseq config whose _name is unset taken as choosing the tokenizer or BPE named in a field of the "
           "kind's name"),
    Mutant("text-bpe-separator-conflict", "text_preprocessing",
           "        if separator != record.bpe_separator:\n", "        if False:\n",
           ("tests/test_text_preprocessing.py",),
           "a --bpe-separator that contradicts the record's BPE separator accepted"),
    Mutant("text-record-parse-model", "text_preprocessing",
           'and isinstance(parse.get("model"), (str, type(None)))):',
           'and isinstance(parse.get("model"), (str, int, type(None)))):',
           ("tests/test_text_preprocessing.py",),
           "a record's source_parse whose model is a number accepted"),
    Mutant("sidefiles-error-names-source", "preprocess_sidefiles",
           "    where = parse_path or parses.source\n", "    where = parses.source\n",
           ("tests/test_preprocess_scale.py::test_side_file_checks_name_the_parse_and_the_line",),
           "a merged shard's out-of-range head named by what made the parses, not by the shard's heads file"),
    Mutant("sidefiles-conllu-longer-line", "preprocess_sidefiles",
           "raise SideDataError(bpe_path, count + 1, f\"{parse_source} has more sentences than the \"",
           "raise SideDataError(bpe_path, count, f\"{parse_source} has more sentences than the \"",
           ("tests/test_preprocess_scale.py::test_side_file_checks_name_the_parse_and_the_line",),
           "a CoNLL-U file longer than its BPE text named at the text's last line, not the line after it"),
    Mutant("sidefiles-forms-unchecked-by-default", "preprocess_sidefiles",
           "scheme, check_forms=True, start=0, stop=None):", "scheme, check_forms=False, start=0, stop=None):",
           ("tests/test_preprocess_scale.py::test_side_file_checks_name_the_parse_and_the_line",),
           "parses_from_conllu not comparing the CoNLL-U's words with the BPE text's unless asked"),
    Mutant("sidefiles-bin-without-index", "preprocess_sidefiles",
           'if not (os.path.exists(prefix + ".idx") and os.path.exists(prefix + ".bin")):',
           'if not os.path.exists(prefix + ".bin"):',
           ("tests/test_preprocess_scale.py::test_side_file_checks_name_the_parse_and_the_line",),
           "a binarized source without its .idx opened (a FileNotFoundError) instead of taken as absent"),
    Mutant("int-lines-int32-boundary", "preprocess_sidefiles",
           "value = flat.astype(np.int32 if flat.max() < 2 ** 31 else np.int64)",
           "value = flat.astype(np.int32 if flat.max() <= 2 ** 31 else np.int64)",
           ("tests/test_preprocess_scale.py::test_int_lines_at_the_int32_boundary",),
           "the side files' digits of 2**31 computed in int32 (wrapped negative)"),
    Mutant("sidefiles-short-labels-line", "preprocess_sidefiles",
           "raise SideDataError(labels_path, min(len(labels), len(sizes)) + 1,",
           "raise SideDataError(labels_path, min(len(labels), len(sizes)),",
           ("tests/test_preprocess_scale.py::test_side_file_checks_name_the_parse_and_the_line",),
           "a labels shard shorter than its heads named at its last line, not the first line it lacks"),
    Mutant("transformer-sf-ones-column-saved", "transformer_sf_fusion",
           'self.register_buffer("_ones_col", ones_col, persistent=False)',
           'self.register_buffer("_ones_col", ones_col, persistent=True)',
           ("tests/test_transformer_sf.py::test_checkpoints_hold_parameters_and_the_char_table_only",),
           "TranSFormer's cross-attention working column saved in checkpoints (older ones then fail a strict load)"),
    Mutant("fused-adam-fp16-stats-ignored", "fused_adam",
           '            if not (getattr(cfg, "use_old_adam", False) or getattr(cfg, "tpu", False)\n'
           '                    or getattr(cfg, "fp16_adam_stats", False)):',
           '            if not (getattr(cfg, "use_old_adam", False) or getattr(cfg, "tpu", False)\n'
           '                    and getattr(cfg, "fp16_adam_stats", False)):',
           ("tests/test_fused_update.py::test_each_opt_out_gives_fairseqs_adam_and_says_so_once",),
           "--fp16-adam-stats stepped by the fused fp32 kernel, where fairseq's adam keeps (or refuses) it"),
    Mutant("fused-adam-any-single-device", "fused_adam",
           "if len(devices) == 1 and devices <= set(_get_fused_kernels_supported_devices()):",
           "if len(devices) == 1:",
           ("tests/test_fused_update.py::test_each_opt_out_gives_fairseqs_adam_and_says_so_once",),
           "parameters on a device without torch's fused AdamW kernel given it"),
    Mutant("fused-adam-announced-per-optimizer", "fused_adam",
           "            if implementation not in _announced:\n", "            if True:\n",
           ("tests/test_fused_update.py::test_each_opt_out_gives_fairseqs_adam_and_says_so_once",),
           "the fused adam's log line repeated for every optimizer built, not once per process"),
    Mutant("preprocess-no-check-forms-inverted", "preprocess_cli",
           "check_forms=not args.no_check_forms, start=start, stop=stop)",
           "check_forms=args.no_check_forms, start=start, stop=stop)",
           ("tests/test_preprocess_scale.py::test_conllu_words_are_checked_unless_no_check_forms",),
           "umst-preprocess --parser conllu checking the CoNLL-U's words only under --no-check-forms"),
    Mutant("preprocess-unsharded-run-unrecorded", "preprocess_cli",
           "            if not args.shard:  # the data-bin's record",
           "            if args.shard:  # the data-bin's record",
           ("tests/test_preprocess_scale.py::test_conllu_words_are_checked_unless_no_check_forms",),
           "an unsharded umst-preprocess run not writing source-parse.json (and each shard writing one)"),
    Mutant("preprocess-long-shards-line", "preprocess_cli",
           "raise SideDataError(heads_path, len(scan) - offset + 1, f\"shards 1-{shard} have more lines than \"",
           "raise SideDataError(heads_path, len(scan) - offset, f\"shards 1-{shard} have more lines than \"",
           ("tests/test_preprocess_scale.py::test_merge_checks_shards_line_by_line",),
           "shards with more lines than the BPE text named at the shard's last line within it, not the first past it"),
    Mutant("compiled-loss-padding", "compiled_loss",
           "ignore_index=self.ignore_index, reduce=True)", "ignore_index=None, reduce=True)",
           ("tests/test_compiled_loss.py",),
           "--compile's loss counts the padded target positions"),
    Mutant("compiled-loss-model-term", "compiled_loss",
           "        return bool(declared())\n", "        return True\n",
           ("tests/test_compiled_loss.py",),
           "--compile's loss replaces a model's log-probabilities that add a term (MSC's --encoder-l2)"),
    Mutant("saved-strides-evaluated", "saved_activation_strides",
           "            return shape_env.deserialize_symexpr(expr)  # a number",
           "            return shape_env.evaluate_symexpr(expr)  # a number",
           ("tests/test_saved_activation_strides.py",),
           "a compiled backward's saved strides are evaluated at the first batch's sizes again"),
    Mutant("saved-strides-compared-at-hint", "saved_activation_strides",
           'FIXED_LINE = "if not _umst_statically_known_true(ph_arg.stride()[k] == real_stride[k]):"',
           "FIXED_LINE = LINE",
           ("tests/test_saved_activation_strides.py",),
           "a compiled backward compares saved strides at the first batch's sizes again (not restrided where equal "
           "there)"),
    Mutant("bench-batch-short-remainder", "bench_harness",
           "    batch = batches[len(batches) // 2]\n", "    batch = batches[-1]\n",
           ("tests/test_benchmark_harness.py::test_a_token_budget_gives_a_full_batch_of_the_length_distribution",),
           "a bench's batch at a token budget is the last of the packed list (the longest sentences, or the short "
           "remainder), not a full batch of the median lengths"),
    Mutant("speed-table-loss-tolerance", "speed_table",
           "tolerance = max(LOSS_NOISE_MARGIN * (dropout + precision), 2 * LOSS_RESOLUTION)",
           "tolerance = max(LOSS_NOISE_MARGIN * max(dropout, precision), 2 * LOSS_RESOLUTION)",
           ("tests/test_speed_table.py::test_loss_check_tolerance_is_twice_the_measured_dropout_and_bf16_noise",),
           "a compiled row's loss tolerance takes the larger of the dropout and bf16 noises, not their sum"),
    Mutant("speed-table-per-flop-eager-base", "speed_table",
           'base = by.get(("transformer", r["precision"], r["compiled"], r["max_tokens"]))',
           'base = by.get(("transformer", r["precision"], False, r["max_tokens"]))',
           ("tests/test_speed_table.py::test_targets_over_several_rows_name_the_rows_not_measured",),
           "a compiled row's words/s per FLOP taken against the eager transformer, not the compiled one"),
    Mutant("speed-table-worst-row", "speed_table",
           "target(name, min(present) if present else None, bound)",
           "target(name, max(present) if present else None, bound)",
           ("tests/test_speed_table.py::test_targets_over_several_rows_name_the_rows_not_measured",),
           "a target over several rows judged by the best row, not the worst"),
    Mutant("speed-table-real-tokens", "speed_table",
           "                real += int((t != self.pad).sum())", "                real += t.numel()",
           ("tests/test_speed_table.py::test_step_probe_counts_real_and_padded_tokens_and_the_flops_of_one_update",),
           "the speed table's real tokens per step count the padding"),
    Mutant("speed-table-busy-mean", "speed_table",
           "round(statistics.median(measured), 3) if measured else None",
           "round(statistics.mean(measured), 3) if measured else None",
           ("tests/test_speed_table.py::test_nvidia_smi_lines_are_read_as_percentages",),
           "a row's GPU busy fraction the mean over the log intervals (the compiling one included), not the median"),
    Mutant("cudagraph-cap-off-by-one", "graph_shapes",
           "if len(shape_cap.recorded) < shape_cap.limit:", "if len(shape_cap.recorded) <= shape_cap.limit:",
           ("tests/test_compile_cudagraphs.py::"
            "test_the_shape_cap_records_the_first_shapes_and_runs_the_rest_compiled_without_graphs",),
           "--compile-cudagraph-shapes N records N + 1 shapes"),
    Mutant("cudagraph-beyond-cap-eager", "graph_shapes",
           "    return shape_cap.graphless\n", "    return eager\n",
           ("tests/test_compile_cudagraphs.py::"
            "test_the_shape_cap_records_the_first_shapes_and_runs_the_rest_compiled_without_graphs",),
           "the shapes beyond the CUDA graph cap run eager, not compiled without graphs"),
    Mutant("cudagraph-shape-key-sizes-only", "graph_shapes",
           "return (layer.training, torch.is_grad_enabled(), _sizes(args), _sizes(kwargs))",
           "return (_sizes(args), _sizes(kwargs))",
           ("tests/test_compile_cudagraphs.py::"
            "test_the_shape_cap_records_the_first_shapes_and_runs_the_rest_compiled_without_graphs",),
           "a recorded CUDA graph shape keyed on sizes alone (training and evaluation, autograd or not, share it)"),
    Mutant("encoder-mask-none-without-padding", "encoder_padding_mask",
           "        lr = layer(x, encoder_padding_mask=encoder_padding_mask)\n",
           "        lr = layer(x, encoder_padding_mask=encoder_padding_mask if encoder_padding_mask.any() else None)\n",
           ("tests/test_patch_encoder_padding_mask.py",),
           "fairseq's encoder gives its layers no padding mask for a batch without padding (a host sync, and a "
           "compiled layer compiled again)"),
    Mutant("bucket-padding-side", "side_data_dataset",
           "        if not self.dataset.left_pad_source:\n            is_pad = is_pad.flip(0)",
           "        if self.dataset.left_pad_source:\n            is_pad = is_pad.flip(0)",
           ("tests/test_length_buckets.py::test_side_data_follows_the_bucket_padding",),
           "a bucketed source's padding counted at the wrong end (its word ids laid out off the tokens)"),
    Mutant("decoder-mask-none-without-padding", "decoder_padding_mask",
           "    self_attn_padding_mask: Optional[Tensor] = prev_output_tokens.eq(self.padding_idx)\n",
           "    self_attn_padding_mask: Optional[Tensor] = (prev_output_tokens.eq(self.padding_idx)\n"
           "                                                if prev_output_tokens.eq(self.padding_idx).any() else None)\n",
           ("tests/test_patch_decoder_padding_mask.py",),
           "fairseq's decoder builds its self-attention padding mask only for a batch with padding (a host sync per "
           "call, and a compiled decoder layer compiled again)"),
    Mutant("lightconv-conv-bias-left", "lightconv_conv_bias",
           "                    self.conv_bias.zero_()", "                    pass",
           ("tests/test_patch_lightconv_conv_bias.py",),
           "a dynamic convolution's unused conv_bias keeps the memory it was allocated in (NaN/Inf in checkpoints)"),
    Mutant("checkpoint-amp-dtype-dropped", "checkpoint_precision",
           "                    task.checkpoint_amp_dtype = mixed_precision.configured_amp_dtype(cfg)",
           "                    task.checkpoint_amp_dtype = None",
           ("tests/test_precision_flags.py::test_fairseq_validate_under_translation",),
           "--amp without --amp-dtype validates and decodes a bf16-trained checkpoint under fp16 autocast"),
    Mutant("validation-autocast-off", "task_autocast",
           '            with mixed_precision.inference_autocast(self, model, "validation"):',
           "            if True:  # (no autocast)",
           ("tests/test_precision_flags.py::test_fairseq_validate_under_translation",),
           "fairseq-validate and training's validation never autocast under --amp"),
    Mutant("bucket-percentile-method", "pair_dataset_sizes",
           'method="lower")', 'method="higher")',
           ("tests/test_length_buckets.py::test_fairseqs_buckets_under_numpy_2",),
           "--num-batch-buckets' bucket lengths the higher percentiles, not fairseq's lower ones"),
    Mutant("transformer-sf-fusion-reads-fused-slow", "transformer_sf_layer",
           "            x_fast = self._fast(self._fast_fused, x_fast, fast_mid, slow_mid, side)",
           "            x_fast = self._fast(self._fast_fused, x_fast, fast_mid, x_slow, side)",
           ("tests/test_transformer_sf.py::test_every_block_computes_fig_3s_equations",),
           "the fast branch's cross-granularity attention reads the slow branch after the slow one's (sequential "
           "fusion), not its post-SAN state; in the reference and the lean path alike",
           also=(("            x_fast = self._fast(self._fast_fused_lean, x_fast, fast_mid, slow_mid, side)",
                  "            x_fast = self._fast(self._fast_fused_lean, x_fast, fast_mid, x_slow, side)"),)),
    Mutant("umst-word-stream-before-word-gcn", "umst_layer",
           "        if self.word_gcn is not None:\n"
           "            x = self._maybe_recompute(self._intra_group, x, graphs)\n"
           "        x_word = self._maybe_recompute(self._word_stream, x, graphs)\n",
           "        x_in = x\n"
           "        if self.word_gcn is not None:\n"
           "            x = self._maybe_recompute(self._intra_group, x, graphs)\n"
           "        x_word = self._maybe_recompute(self._word_stream, x_in, graphs)\n",
           ("tests/test_umst.py::test_every_block_computes_figure_2s_equations",),
           "UMST's word stream pooled from the block's input, not from the subwords after the word GCN (figure 2); "
           "every path alike"),
    Mutant("raw-text-parse-cache-misaligned", "task",
           "for key, parse in zip(todo, parsers.safe_parse(self._parser, sentences)):",
           "for key, parse in zip(keys, parsers.safe_parse(self._parser, sentences)):",
           ("tests/test_inference.py::test_raw_text_reaches_the_model_as_in_training[umst]",),
           "raw input's parses stored under the batch's sentences in order, not under the distinct sentences parsed "
           "(a sentence given twice shifts every parse after it)"),
    Mutant("train-sh-cudagraphs-unbucketed", "train_sh",
           '[[ -n "$BUCKETS" || "$CUDAGRAPHS" -eq 0 ]] || BUCKETS=8',
           'true',
           ("tests/test_train_sh_plan.py::test_cudagraphs_pads_to_eight_length_buckets_unless_told_how_many",),
           "train.sh --cudagraphs leaves the sentences unbucketed (a CUDA graph recorded for every batch shape)"),
    Mutant("train-sh-cudagraphs-two-bucket-settings", "train_sh",
           '( -n "$BUCKETS" || "$CUDAGRAPHS" -eq 1 )',
           '( -n "$BUCKETS" )',
           ("tests/test_train_sh_plan.py::test_cudagraphs_pads_to_eight_length_buckets_unless_told_how_many",),
           "train.sh --cudagraphs with a hydra override of the buckets passes both (one silently wins)"),
    Mutant("preemption-handlers-kept-while-exiting", "preemption",
           "    if not _previous:\n        atexit.register(_ignore_while_exiting)\n",
           "    if not _previous:\n        pass\n",
           ("tests/test_preemption.py::"
            "test_a_warning_while_the_interpreter_tears_down_does_not_kill_a_process_that_trained",),
           "a process that trained keeps its stop handlers until the interpreter drops them: a signal while torch "
           "and fairseq tear down ends it with the signal's status"),
    Mutant("compile-cache-key-without-patches", "compile_cache",
           'return f"umst_plugin compiler patches {compiler_patches_key()}"',
           'return "umst_plugin compiler patches"',
           ("tests/test_compile_cache.py::test_the_caches_are_keyed_on_the_plugin_s_compiler_patches",),
           "inductor's caches not keyed on the plugin's compiler patches (a graph cached before a patch is loaded "
           "after it)"),
    Mutant("compile-cache-plugin-dir-taken-as-users", "compile_cache",
           "if not chosen or chosen == environ.get(_SET_BY_PLUGIN):",
           "if not chosen:",
           ("tests/test_compile.py::test_only_a_cache_dir_the_user_chose_overrides_the_save_dirs",),
           "the compile cache a parent process's plugin set is taken for the user's choice (a child run caches "
           "outside its save dir)"),
    Mutant("umst-packed-upgrade-order", "umst_attention",
           '("q_proj", "k_proj", "v_proj")',
           '("k_proj", "q_proj", "v_proj")',
           ("tests/test_umst.py::test_checkpoints_with_separate_projections_load_into_the_packed_ones",),
           "an older checkpoint's separate q and k maps packed in the wrong order"),
    Mutant("prime-conv-input-gradient-padding", "prime_dynamic_conv",
           "before, after = K - 1 - padding_l, padding_l",
           "before, after = padding_l, K - 1 - padding_l",
           ("tests/test_dynamic_conv.py",),
           "the dynamic convolution's input gradient padded as the forward's input (the transposed correlation "
           "mirrored: right only for a centred window)"),
    Mutant("transformer-sf-compiled-band-direction", "transformer_sf_attention",
           "offset = position.view(1, -1) - position.view(-1, 1)  # j - i, L x L",
           "offset = position.view(-1, 1) - position.view(1, -1)  # j - i, L x L",
           ("tests/test_transformer_sf_lean.py::test_band_terms_added_by_index_equal_the_scatter",),
           "the compiled form of the character attention's relative band reads offset i - j, not j - i"),
    Mutant("amp-cache-as-it-lies-only", "amp_weights",
           "return dims(view) == dims(param)",
           "return view.shape == param.shape and view.stride() == param.stride()",
           ("tests/test_amp_weights.py::test_what_is_left_to_autocast",),
           "autocast's parameter cache takes only casts of a parameter as it lies (a weight read transposed or a "
           "bias viewed for broadcasting cast again in every layer)"),
    Mutant("speed-table-peak-pcie-as-sxm", "speed_table",
           '("H100 PCIe", 756.0e12), ("H100", 989.4e12)',
           '("H100", 989.4e12), ("H100 PCIe", 756.0e12)',
           ("tests/test_speed_table.py::test_mfu_takes_the_cards_own_dense_bf16_peak",),
           "an H100 PCIe's MFU taken against the SXM H100's peak (the shorter name matched first)"),
    Mutant("conllu-multiword-head-inside", "conllu_reader",
           'head = next((w for w in members if w["head"] not in inside), members[0])',
           'head = next((w for w in members if w["head"] in inside), members[0])',
           ("tests/test_conllu_reader.py",),
           "a CoNLL-U multi-word token takes the head of a member attached inside it (the token points at itself), "
           "not its syntactic head word's"),
    Mutant("stanza-multiword-head-inside", "conllu_reader",
           "wid, head, label = next((w for w in words if w[1] not in inside), words[0])",
           "wid, head, label = next((w for w in words if w[1] in inside), words[0])",
           ("tests/test_conllu_reader.py::test_a_multiword_token_takes_the_member_whose_head_is_outside_it",),
           "a stanza multi-word token takes the head of a member attached inside it, not its syntactic head word's"),
    Mutant("conllu-empty-node-as-range", "conllu_reader",
           'if len(tid) == 3 and tid[1] == "-":',
           "if len(tid) == 3:",
           ("tests/test_conllu_reader.py",),
           "an enhanced-UD empty node (8.1) read as a multi-word token's range"),
    Mutant("word-boundaries-first-entry-special", "word_boundaries",
           "        if i < n_special:\n",
           "        if i <= n_special:\n",
           ("tests/test_side_data.py::test_the_first_symbol_after_the_special_ones_is_read_like_any_other",),
           "the dictionary's first entry after the special symbols (its most frequent piece) read as special: it "
           "begins a word and never continues one"),
    Mutant("side-data-line-counts-together", "side_files",
           "if len(word_ids) != len(src_sizes) or len(heads) != len(src_sizes):",
           "if len(word_ids) != len(src_sizes) and len(heads) != len(src_sizes):",
           ("tests/test_side_data_errors.py::test_task_refuses_a_head_file_of_another_length",),
           "a data-bin's side files checked for the source's line count only when both differ (a head file of "
           "another length reaches numpy's shape error)"),
    Mutant("parser-batches-token-limit", "preprocess_chunks",
           "(batch_tokens and words + len(s) > batch_tokens)",
           "(batch_tokens or words + len(s) > batch_tokens)",
           ("tests/test_preprocess_scale.py::"
            "test_parser_batches_hold_at_most_batch_size_sentences_and_batch_tokens_words",),
           "umst-preprocess hands its parser one sentence at a time (the word limit taken as set when it is not)"),
    Mutant("preprocess-workers-ignored", "preprocess_chunks",
           'workers = getattr(self.args, "workers", 1) or 1',
           "workers = 1",
           ("tests/test_preprocess_scale.py::test_resume_after_interrupt_is_byte_identical",),
           "umst-preprocess --workers N parses in one process (the same files, N times slower)"),
    Mutant("preprocess-removes-other-shards-files", "preprocess_chunks",
           'if ".tmp-" in name and name.split(".tmp-")[0] in ours:',
           'if ".tmp-" in name:',
           ("tests/test_preprocess_scale.py::test_a_shard_removes_only_its_own_chunks_half_written_files",),
           "a shard starting up removes every half-written chunk in a shared work dir, another shard's too (its "
           "rename then fails)"),
    Mutant("conllu-shard-one-line-early", "preprocess_sidefiles",
           "if line_no <= start or (stop is not None and line_no > stop):",
           "if line_no < start or (stop is not None and line_no > stop):",
           ("tests/test_preprocess_scale.py::test_conllu_shards_merged_equal_unsharded",),
           "a --parser conllu shard takes the parse of the line before its first as well"),
    Mutant("head-out-of-range-line", "preprocess_sidefiles",
           'raise SideDataError(where, line + 1, f"head {parses.heads[bad[0]]} out of range',
           'raise SideDataError(where, line, f"head {parses.heads[bad[0]]} out of range',
           ("tests/test_preprocess_scale.py::test_merge_checks_shards_line_by_line",),
           "a head out of range named at the 0-based line of its parse file"),
    Mutant("side-data-heads-line", "side_files",
           "raise SideDataError(head_path, i + 1,",
           "raise SideDataError(head_path, i,",
           ("tests/test_side_data_errors.py::test_task_names_the_first_sentence_whose_heads_do_not_fit_its_words",),
           "a head file's error names the 0-based line of the sentence whose heads do not fit its words"),
    Mutant("preprocess-stale-chunks-reason", "preprocess_chunks",
           "changed = sorted(k for k in manifest if old.get(k) != manifest[k])",
           "changed = sorted(k for k in manifest if old.get(k) == manifest[k])",
           ("tests/test_preprocess_scale.py::test_changed_input_discards_stale_chunks",),
           "discarded chunks' warning names the settings that did not change, not those that did"),
    Mutant("conllu-longer-than-text-line", "preprocess_sidefiles",
           'raise SideDataError(bpe_path, count + 1, f"{parse_source} has more sentences',
           'raise SideDataError(bpe_path, count, f"{parse_source} has more sentences',
           ("tests/test_side_data_errors.py::test_a_parse_file_longer_than_the_text_names_the_line_after_the_last",),
           "a CoNLL-U file longer than its text named at the text's last line, not the line after it"),
    Mutant("collater-drops-batch-hints", "side_data_dataset",
           '            batch["net_input"].update(self.batch_hints(src_tokens))\n',
           "            pass\n",
           ("tests/test_side_data.py::test_the_collater_hands_transformer_sf_its_character_length",),
           "the collater drops the models' host-side batch hints (TranSFormer reads its character length off the "
           "device: a host sync per batch)"),
    Mutant("spacy-pipeline-without-parser-accepted", "spacy_backend",
           'if "parser" not in nlp.pipe_names:',
           "if False:",
           ("tests/test_parsers.py::test_a_spacy_pipeline_without_a_parser_is_refused",),
           "a spaCy pipeline without a dependency parser accepted (every sentence parsed into a fallback graph)"),
    Mutant("spacy-loader-refuses-its-model", "spacy_backend",
           'if "parser" not in nlp.pipe_names:',
           'if "parser" in nlp.pipe_names:',
           ("tests/test_parsers.py",),
           "the spaCy loader refuses the pipeline it should load (the spaCy tests skipped this as a model not "
           "installed)"),
    Mutant("spacy-batch-size-ignored", "spacy_backend",
           'self.batch_size = getattr(args, "batch_size", None) or 256',
           "self.batch_size = 256",
           ("tests/test_parsers.py::test_spacy_backend_as_the_task_builds_it",),
           "umst-preprocess --batch-size never reaches spaCy's nlp.pipe (always 256)"),
    Mutant("task-side-shard-of-another-epoch", "task",
           "data_path = paths[(epoch - 1) % len(paths)]",
           "data_path = paths[(epoch + 1) % len(paths)]",
           ("tests/test_side_data.py::test_data_shards_round_robin",),
           "the side files read from another data shard than fairseq's tokens in an epoch (data1:data2:data3)"),
    Mutant("task-side-shards-combined-outside-training", "task",
           "            if not combine:\n                break",
           "            if combine:\n                break",
           ("tests/test_side_data.py::test_shards_within_a_data_dir_combine_for_training_only",),
           "train1's side data left out of training, and valid1's added to valid (combine read backwards)"),
    Mutant("task-valid-batches-drop-the-last", "task",
           "if dataset is not self.datasets.get(self.cfg.train_subset):",
           "if dataset is self.datasets.get(self.cfg.train_subset):",
           ("tests/test_side_data.py::test_every_sentence_outside_training_is_batched",),
           "validation and decoding batched in multiples of 8, dropping up to 7 sentences; training's batches not"),
    Mutant("task-positional-batch-multiple-missed", "task",
           "if len(args) >= 5:",
           "if len(args) > 5:",
           ("tests/test_side_data.py::test_every_sentence_outside_training_is_batched",),
           "a required_batch_size_multiple passed by position also set by keyword (a TypeError)"),
    Mutant("task-raw-input-note-every-batch", "task",
           "        self._noted_raw_input = True\n        if self._text_mode()",
           "        self._noted_raw_input = False\n        if self._text_mode()",
           ("tests/test_side_data.py::test_raw_input_notes_its_preparation_once",),
           "the note of how raw input is prepared logged for every batch, not once"),
    Mutant("task-rebuilds-side-inputs-a-batch-carries", "task",
           'if not net_input or "src_tokens" not in net_input or "src_word_ids" in net_input:',
           'if not net_input or "src_tokens" not in net_input and "src_word_ids" in net_input:',
           ("tests/test_side_data.py::test_interactive_word_ids_match_preprocessed",),
           "fairseq-generate's batches get the fallback graph in place of the data-bin's parsed heads"),
    Mutant("task-parse-cache-keyed-with-padding", "task",
           "keys = [tuple(int(t) for t in tokens if int(t) not in (eos, pad)) for tokens in src_tokens]",
           "keys = [tuple(int(t) for t in tokens if int(t) != eos) for tokens in src_tokens]",
           ("tests/test_parsers.py::test_interactive_input_is_parsed_once_per_sentence_whatever_its_padding",),
           "raw input's parse cache keyed with the padding: a sentence padded otherwise is parsed again"),
    Mutant("task-fallback-warning-every-batch", "task",
           "                self._warned_fallback = True",
           "                self._warned_fallback = False",
           ("tests/test_parsers.py::test_interactive_input_without_a_parser_warns_once",),
           "the warning that raw input gets the fallback graph logged for every batch"),
    Mutant("task-source-parser-model-ignored", "task",
           "options = Namespace(parser_model=self.cfg.source_parser_model or None,",
           "options = Namespace(parser_model=None,",
           ("tests/test_parsers.py::test_the_task_s_source_parser_model_reaches_the_parser",),
           "--source-parser-model never reaches the parser of raw input (its default pipeline parses instead)"),
    Mutant("msmsa-stack-bias-kept-for-another-mask", "msmsa_window_bias",
           "if entry is None or entry[0] is not key_padding_mask or entry[1] != key:",
           "if entry is None or entry[0] is not key_padding_mask and entry[1] != key:",
           ("tests/test_msmsa_lean.py::test_a_stack_s_bias_follows_its_padding_mask",),
           "a stack's window bias reused for another padding mask of the same shape, or for its mask changed in place"),
    Mutant("msmsa-window-masks-pickled-in-scope", "msmsa_window_bias",
           'state["_constants"], state["_entry"], state["_active"] = {}, None, False',
           'state["_constants"], state["_entry"], state["_active"] = {}, None, True',
           ("tests/test_msmsa_lean.py::test_window_masks_keep_their_rules_and_pickle_without_their_state",),
           "a pickled stack's window masks restored inside an open scope (a bias kept across batches)"),
    Mutant("msmsa-head-rules-made-every-call", "msmsa_window_bias",
           "        if value is None:\n            scales",
           "        if value is not None:\n            scales",
           ("tests/test_msmsa_lean.py::test_window_masks_keep_their_rules_and_pickle_without_their_state",),
           "the heads' half-width rule copied to the device at every layer's call, never kept"),
    Mutant("prime-init-schemes-swapped", "prime_layer",
           '    if init == "pytorch":\n        bound = 1.0 / math.sqrt(fan_in)',
           '    if init != "pytorch":\n        bound = 1.0 / math.sqrt(fan_in)',
           ("tests/test_prime.py::test_initialisation_of_each_branch",),
           "Prime's --prime-init pytorch (the paper's default) drawing Xavier weights and zero biases, and xavier "
           "nn.Linear's"),
    Mutant("prime-xavier-skips-kernel-predictors", "prime_layer",
           "                    if lin is not None:\n                        nn.init.xavier_uniform_(lin.weight)",
           "                    if lin is None:\n                        nn.init.xavier_uniform_(lin.weight)",
           ("tests/test_prime.py::test_initialisation_of_each_branch",),
           "--prime-init xavier leaving the dynamic convolution's kernel predictors at nn.Linear's default"),
    Mutant("preprocess-pool-queue-unbounded-by-one", "preprocess_chunks",
           "                        if len(pending) >= 2 * workers:",
           "                        if len(pending) > 2 * workers:",
           ("tests/test_preprocess_scale.py::test_worker_pool_queues_a_bounded_window_and_stops_after_chunks",),
           "the parser pool reading one chunk more ahead of its oldest result than its bound of 2 x --workers"),
    Mutant("preprocess-pool-ignores-stop-after-chunks", "preprocess_chunks",
           "                        if stop_after is not None and finished >= stop_after:\n"
           "                            raise KeyboardInterrupt(f\"deliberate interrupt after {finished} chunks \"",
           "                        if stop_after is None and finished >= stop_after:\n"
           "                            raise KeyboardInterrupt(f\"deliberate interrupt after {finished} chunks \"",
           ("tests/test_preprocess_scale.py::test_worker_pool_queues_a_bounded_window_and_stops_after_chunks",),
           "--workers ignoring --stop-after-chunks (the interrupt the resume tests use never comes in the pool)"),
    Mutant("umst-debug-checks-ignored", "umst_graphs",
           "        if check_values or (check_values is None and debug_checks()):",
           "        if check_values or (check_values is not None and debug_checks()):",
           ("tests/test_umst_lean.py::test_debug_checks_validate_the_side_inputs_only_when_asked",),
           "UMST_DEBUG_CHECKS=1 no longer making the model re-check its side inputs' values"),
    Mutant("umst-dense-operators-need-the-one-hot", "umst_graphs",
           "    if onehot is None or onehot.dtype != work:",
           "    if onehot is None and onehot.dtype != work:",
           ("tests/test_umst_lean.py::test_dense_operators_build_the_one_hot_they_are_not_given",),
           "dense_operators failing when called without build_graphs' one-hot map"),
    Mutant("msmsa-scale-one-dropout-in-eval", "msmsa_windowed_attention",
           "    if training and dropout_p > 0:\n        weight = F.dropout(weight, p=dropout_p, training=True)",
           "    if training or dropout_p > 0:\n        weight = F.dropout(weight, p=dropout_p, training=True)",
           ("tests/test_msmsa.py::test_scale_one_heads_drop_their_weight_in_training_only",),
           "MSMSA's scale-1 heads dropping their weight in evaluation"),
    Mutant("msmsa-scale-one-never-dropped", "msmsa_windowed_attention",
           "    if training and dropout_p > 0:\n        weight = F.dropout(weight, p=dropout_p, training=True)",
           "    if training and dropout_p > 0:\n        weight = F.dropout(weight, p=dropout_p, training=False)",
           ("tests/test_msmsa.py::test_scale_one_heads_drop_their_weight_in_training_only",),
           "MSMSA's scale-1 heads without attention dropout in training"),
    Mutant("msmsa-scale-one-layer-skips-q-and-k", "msmsa_windowed_attention",
           'self.all_self_only = all(scale == Scale("fixed", 1) for scale in self.head_scales)',
           'self.all_self_only = all(scale != Scale("fixed", 1) for scale in self.head_scales)',
           ("tests/test_msmsa.py::test_q_and_k_projections_always_get_a_gradient",),
           "a layer of scale-1 heads only, per scale, leaving q and k without a gradient (DDP's unused parameters)"),
    Mutant("msmsa-scale-names", "msmsa_windowed_attention",
           '            return "N" if self.value == 1 else f"N/{self.value}"',
           '            return "N" if self.value != 1 else f"N/{self.value}"',
           ("tests/test_msmsa.py::test_scale_parsing_and_odd_sizes",),
           "relative scales named N/k the wrong way round in the module summary and the head maps' titles"),
    Mutant("msmsa-incremental-drops-step-padding", "msmsa_windowed_attention",
           "new = key_padding_mask if key_padding_mask is not None else x.new_zeros(batch, tgt_len, dtype=torch.bool)",
           "new = key_padding_mask if key_padding_mask is None else x.new_zeros(batch, tgt_len, dtype=torch.bool)",
           ("tests/test_msmsa.py::test_incremental_decoding_of_a_left_padded_batch_matches_full_module",),
           "MSMSA's decoding dropping a step's key padding mask once the cache holds keys"),
    Mutant("msmsa-window-rule-in-checkpoints", "msmsa_windowed_attention",
           "dtype=torch.long), persistent=False)",
           "dtype=torch.long), persistent=True)",
           ("tests/test_msmsa.py::test_parameter_count_equals_transformer",),
           "MSMSA's window rule saved in checkpoints (a checkpoint without it no longer loads)"),
    Mutant("msmsa-output-bias-initialised-as-linear", "msmsa_windowed_attention",
           "        if self.out_proj.bias is not None:\n            nn.init.constant_(self.out_proj.bias, 0.0)",
           "        if self.out_proj.bias is None:\n            nn.init.constant_(self.out_proj.bias, 0.0)",
           ("tests/test_msmsa.py::test_parameter_count_equals_transformer",),
           "MSMSA's output projection bias left at nn.Linear's random init where fairseq's attention zeroes it"),
    Mutant("char-table-plain-words-refused", "transformer_sf_char_table",
           '    if style == "word":\n        return symbol, False, False',
           '    if style != "word":\n        return symbol, False, False',
           ("tests/test_transformer_sf.py::test_char_table_plain_words_and_marker_like_symbols",),
           "TranSFormer's character table refusing a vocabulary of plain words (style word)"),
    Mutant("char-table-plain-words-glued", "transformer_sf_char_table",
           '    if style == "word":\n        return symbol, False, False',
           '    if style == "word":\n        return symbol, False, True',
           ("tests/test_transformer_sf.py::test_char_table_plain_words_and_marker_like_symbols",),
           "TranSFormer's character table gluing plain words into one"),
    Mutant("char-table-long-numbers-special", "transformer_sf_char_table",
           'symbol.startswith("madeupword") and symbol[10:].isdigit()',
           'symbol.startswith("madeupword") or symbol[10:].isdigit()',
           ("tests/test_transformer_sf.py::test_char_table_plain_words_and_marker_like_symbols",),
           "a number of 11+ digits taken for one of fairseq's madeupword fillers (one opaque character)"),
    Mutant("char-table-bare-marker-not-joining", "transformer_sf_char_table",
           "        if symbol.endswith(BPE_MARK):\n            return symbol[:-2], False, True",
           "        if len(symbol) > 2 and symbol.endswith(BPE_MARK):\n            return symbol[:-2], False, True",
           ("tests/test_transformer_sf.py::test_char_table_plain_words_and_marker_like_symbols",),
           "a bare @@ read as a word of its own, where the task's word boundaries join it to the next token"),
    Mutant("msc-encoder-layer-alone-ignores-padding", "msc_layer",
           "if attn_mask is None and padding_mask is not None:",
           "if attn_mask is None and padding_mask is None:",
           (MSC_LAYER_ALONE,),
           "an MSC encoder layer called without its stack's key mask attending to padded keys"),
    Mutant("msc-decoder-layer-alone-causal-only-with-padding", "msc_layer",
           "if self_mask is None and (self_attn_mask is not None or self_attn_padding_mask is not None):",
           "if self_mask is None and (self_attn_mask is not None and self_attn_padding_mask is not None):",
           (MSC_LAYER_ALONE,),
           "an MSC decoder layer called alone dropping the causal mask where the target has no padding mask"),
    Mutant("msc-decoder-layer-eval-attention-off", "msc_layer",
           "        self.need_attn = True",
           "        self.need_attn = False",
           (MSC_LAYER_ALONE,),
           "an MSC decoder layer returning no attention over the memory in eval (fairseq's layer returns it)"),
    Mutant("msc-decoder-layer-attention-in-training", "msc_layer",
           "need_weights = need_attn or (not self.training and self.need_attn)",
           "need_weights = need_attn or (not self.training or self.need_attn)",
           (MSC_LAYER_ALONE,),
           "an MSC decoder layer computing and returning its attention weights in training unasked"),
    Mutant("msc-decoder-layer-incremental-state-ignored", "msc_layer",
           "if self.reference or (incremental_state is not None and step is None):",
           "if self.reference and (incremental_state is not None and step is None):",
           (MSC_LAYER_ALONE,),
           "an MSC decoder layer given fairseq's incremental state (no lean step) decoding each token alone"),
    Mutant("msc-decoder-layer-context-keys-left-out", "msc_layer",
           "([self.context_attn] if self.context_attn is not None else [])",
           "([self.context_attn] if self.context_attn is None else [])",
           (MSC_LAYER_ALONE,),
           "an MSC decoder layer called alone leaving the context C^n out of its cross keys and values (Eq. 13)"),
    Mutant("msc-reference-decoder-layer-attention-in-training", "msc_layer",
           "need_weights=need_attn or (not self.training and self.need_attn),",
           "need_weights=need_attn or (self.training and self.need_attn),",
           (MSC_LAYER_ALONE,),
           "the reference MSC decoder layer returning attention in training and none in eval"),
    Mutant("msc-decoder-layer-head-weights-need-eval", "msc_layer",
           "        if need_head_weights:\n            need_attn = True\n        if need_weights is None:",
           "        if need_head_weights:\n            need_attn = False\n        if need_weights is None:",
           (MSC_LAYER_ALONE,),
           "an MSC decoder layer asked for per-head weights in training returning none"),
    Mutant("msc-generation-keeps-attention", "msc_layer",
           "def make_generation_fast_(self, need_attn: bool = False, **kwargs):",
           "def make_generation_fast_(self, need_attn: bool = True, **kwargs):",
           (MSC_LAYER_ALONE,),
           "an MSC decoder layer still computing attention weights after make_generation_fast_() (fairseq's default)"),
    Mutant("msc-ffn-cell-width", "msc_layer",
           "hidden = ffn_dim or 4 * embed_dim",
           "hidden = ffn_dim and 4 * embed_dim",
           ("tests/test_msc.py::test_ablations_change_structure",),
           "the FFN context cell (table 5) 4 x C wide where docs/msc.md gives the encoder's FFN width"),
    Mutant("msc-decoder-positions-dropped", "msc_decoder",
           "if self.embed_positions is not None:",
           "if self.embed_positions is None:",
           ("tests/test_msc.py::test_plain_ablation_computes_fairseqs_prenorm_transformer",),
           "MSC's decoder embedding its target without positions (lean and reference forms alike)"),
    Mutant("msc-decoder-alignment-heads-ignored", "msc_decoder",
           "if alignment_heads is not None:",
           "if alignment_heads is None:",
           ("tests/test_msc.py::test_plain_ablation_computes_fairseqs_prenorm_transformer",),
           "MSC's decoder averaging every head's attention where fairseq's --alignment-heads asks for the first few"),
    Mutant("msc-reference-decoder-causal-with-full-context", "msc_decoder",
           "if incremental_state is None and not full_context_alignment else None",
           "if incremental_state is None or not full_context_alignment else None",
           ("tests/test_msc.py::test_plain_ablation_computes_fairseqs_prenorm_transformer",),
           "the reference MSC decoder keeping its causal mask under fairseq's full_context_alignment"),
    Mutant("msc-decoder-foreign-encoder-out", "msc_decoder",
           'if encoder_out is None or "msc_block_out" not in encoder_out:',
           'if encoder_out is None and "msc_block_out" not in encoder_out:',
           ("tests/test_msc.py::test_the_decoder_needs_msc_encoder_out",),
           "MSC's decoder given no encoder output failing with a TypeError instead of naming what it needs"),
    Mutant("count-lines-drops-unterminated-last-line", "preprocess_text",
           'return n + (last != b"\\n")',
           'return n + (last == b"\\n")',
           ("tests/test_preprocess_scale.py::test_count_lines_counts_a_last_line_without_its_newline",),
           "the shards' line count missing a last line without its newline (and counting one past the end)"),
    Mutant("count-lines-last-byte", "preprocess_text",
           "last = block[-1:]",
           "last = block[+1:]",
           ("tests/test_preprocess_scale.py::test_count_lines_counts_a_last_line_without_its_newline",),
           "the shards' line count reading a block's tail from its second byte, not its last"),
    Mutant("scan-exact-path-word-count", "preprocess_text",
           "n_words.append(w[-1] if w else 0)",
           "n_words.append(w[+1] if w else 0)",
           ("tests/test_preprocess_scale.py::test_scan_bpe_unicode_whitespace_takes_the_exact_path",),
           "the exact (non-ASCII whitespace) scan counting a line's words from its second token's word id"),
    Mutant("parser-chunk-one-line-early", "preprocess_text",
           "if number <= start:",
           "if number < start:",
           ("tests/test_preprocess_scale.py::test_parser_words_of_a_line_range",),
           "a parser chunk's words starting one line before its range (the line before parsed twice)"),
    Mutant("parser-chunk-past-stop", "preprocess_text",
           "if stop is not None and number > stop:",
           "if stop is None and number > stop:",
           ("tests/test_preprocess_scale.py::test_parser_words_of_a_line_range",),
           "a parser chunk's words running on past its range to the end of the file"),
    Mutant("preemption-stop-saves-before-validate-after", "preemption",
           "and num_updates >= cfg.dataset.validate_after_updates))",
           "and num_updates > cfg.dataset.validate_after_updates))",
           ("tests/test_preemption.py::test_a_stop_lets_fairseq_save_where_it_saves_anyway",),
           "a stop at --validate-after-updates itself saving checkpoint_last.pt beside fairseq's own save there"),
    Mutant("preemption-agreed-flag-any-sum", "preemption",
           "return flag.read() > 0",
           "return flag.read() >= 0",
           ("tests/test_preemption.py::test_the_agreed_flag_is_the_ranks_sum_and_one_process_reads_its_own",),
           "a multi-rank run stopping at its first update boundary without any signal"),
    Mutant("preemption-request-kept-across-trainings", "preemption",
           "    if not any(True for _ in _trainers):\n        reset()",
           "    if any(True for _ in _trainers):\n        reset()",
           ("tests/test_preemption.py::test_a_new_training_forgets_the_request_that_stopped_the_last_one",),
           "a process that trains again after a stop keeps the old request and stops at its first update"),
    Mutant("preemption-first-signal-dropped", "preemption",
           "    if not _received:  # the first counts",
           "    if _received:  # the first counts",
           ("tests/test_preemption.py::test_the_first_signal_during_training_is_the_request",),
           "a stop signal during training recorded only once a request exists: training never stops"),
    Mutant("prime-conv-keeps-fp32-logits", "prime_dynamic_conv",
           "ctx.kept_probs = all(lg.dtype == acc for lg in logits)",
           "ctx.kept_probs = all(lg.dtype != acc for lg in logits)",
           ("tests/test_dynamic_conv.py::test_backward_keeps_the_softmax_outputs_or_the_half_precision_logits",),
           "the dynamic convolution keeping fp32 softmax outputs for half-precision logits (twice their bytes)"),
    Mutant("prime-conv-bias-reshaped", "prime_dynamic_conv",
           "out = out + self.conv_bias.view(1, 1, -1)",
           "out = out + self.conv_bias.view(1, 1, 1)",
           ("tests/test_dynamic_conv.py::test_biases_equal_fairseqs",),
           "the dynamic convolution's output bias (conv_bias=True) reshaped to one channel"),
    Mutant("prime-conv-width-one-keeps-every-input", "prime_dynamic_conv",
           "        if K > 1:\n            utils.set_incremental_state",
           "        if K >= 1:\n            utils.set_incremental_state",
           ("tests/test_dynamic_conv.py::test_incremental_decoding_equals_the_causal_convolution",),
           "a width-1 dynamic convolution keeping every decoded input in its buffer (window[-0:] is all of it)"),
    Mutant("scheme-any-sentencepiece-mark", "word_boundaries",
           "return SENTENCEPIECE if begins > continues else SUBWORD_NMT",
           "return SENTENCEPIECE if begins else SUBWORD_NMT",
           ("tests/test_side_data.py::test_the_task_the_char_table_and_preprocessing_read_one_scheme_by_the_markers_count",),
           "the subword scheme read as sentencepiece wherever one piece starts with U+2581 (a stray one joins every "
           "word of a subword-nmt corpus)"),
    Mutant("preprocess-scheme-from-first-line", "preprocess_cli",
           "def sniff_scheme(path, lines=SNIFF_LINES):",
           "def sniff_scheme(path, lines=1):",
           ("tests/test_side_data.py::test_the_task_the_char_table_and_preprocessing_read_one_scheme_by_the_markers_count",),
           "umst-preprocess --bpe auto reading the scheme off the first line alone"),
    Mutant("char-table-style-own-rule", "transformer_sf_char_table",
           "style = detect_scheme(symbols[num_special:])",
           "style = detect_scheme(symbols[num_special:num_special + 1])",
           ("tests/test_side_data.py::test_the_task_the_char_table_and_preprocessing_read_one_scheme_by_the_markers_count",),
           "TranSFormer's character table detecting its style from the dictionary's first entry, not the task's count"),
    Mutant("preemption-stop-skips-epoch-end", "preemption",
           "    if end_of_epoch or saves:  # what fairseq does",
           "    if end_of_epoch and saves:  # what fairseq does",
           ("tests/test_preemption.py::test_a_stop_runs_fairseqs_validate_and_save_where_it_acts_and_saves_nothing_after_it",),
           "a stop at an epoch's end or a --save-interval-updates update skipping fairseq's validation and save there"),
    Mutant("preemption-stop-saves-twice", "preemption",
           "        saved = saves or stopped",
           "        saved = saves and stopped",
           ("tests/test_preemption.py::test_a_stop_runs_fairseqs_validate_and_save_where_it_acts_and_saves_nothing_after_it",),
           "a stop writing checkpoint_last.pt again right after fairseq's validate_and_save saved it"),
    Mutant("preemption-stop-saves-after-fairseq", "preemption",
           "    if not saved and not no_save:  # checkpoint_last.pt",
           "    if not saved or not no_save:  # checkpoint_last.pt",
           ("tests/test_preemption.py::test_a_stop_runs_fairseqs_validate_and_save_where_it_acts_and_saves_nothing_after_it",),
           "a stop saving checkpoint_last.pt wherever --no-save is off, also where fairseq just saved"),
    Mutant("transformer-sf-input-gcn-dropped", "transformer_sf_layer",
           'if cfg.slow_gcn == "input" and self.uses_slow_input else None)',
           'if cfg.slow_gcn != "input" and self.uses_slow_input else None)',
           ("tests/test_transformer_sf.py::test_every_block_computes_fig_3s_equations",),
           "TranSFormer's default subword GCN on the input not built (and one built, unused, for every-layer and none)"),
    Mutant("transformer-sf-group-bound-ignored", "transformer_sf_layer",
           "    if side.get(bound) is not None:\n        return int(side[bound])",
           "    if side.get(bound) is None:\n        return int(side[bound])",
           ("tests/test_transformer_sf.py::test_the_group_count_is_the_encoders_bound_without_reading_the_ids",),
           "the GCN's group count read off the ids (a host-device sync per layer on a GPU) where the encoder passes "
           "its bound"),
    Mutant("transformer-sf-group-count-short", "transformer_sf_layer",
           "return int(side[groups].max()) + 1 if side[groups].numel() else 1",
           "return int(side[groups].max()) - 1 if side[groups].numel() else 1",
           ("tests/test_transformer_sf.py::test_the_group_count_is_the_encoders_bound_without_reading_the_ids",),
           "a direct caller's GCN group count two short of the ids' max + 1"),
    Mutant("transformer-sf-band-padded-keys", "transformer_sf_attention",
           "valid = in_range.unsqueeze(0) & (query_groups > 0) & (key_groups > 0)",
           "valid = in_range.unsqueeze(0) & (query_groups > 0) & (key_groups >= 0)",
           ("tests/test_transformer_sf.py::test_boundary_band_gives_no_pair_with_padding",),
           "the boundary-wise band pairing real characters with padded keys"),
    Mutant("transformer-sf-band-padded-queries", "transformer_sf_attention",
           "valid = in_range.unsqueeze(0) & (query_groups > 0) & (key_groups > 0)",
           "valid = in_range.unsqueeze(0) & (query_groups >= 0) & (key_groups > 0)",
           ("tests/test_transformer_sf.py::test_boundary_band_gives_no_pair_with_padding",),
           "the boundary-wise band giving padded queries relative terms"),
    Mutant("transformer-sf-band-form-overridden", "transformer_sf_attention",
           "    if gather is None:\n        gather = compiling()",
           "    if gather is not None:\n        gather = compiling()",
           ("tests/test_transformer_sf_lean.py::test_band_terms_added_by_index_equal_the_scatter",),
           "add_band ignoring the form its caller asks for (its equivalence test then compares the scatter with "
           "itself)"),
    Mutant("prime-standard-padding-check-inclusive", "prime_multi_kernel_conv",
           "if not 0 <= padding_l < kernel_size:",
           "if not 0 <= padding_l <= kernel_size:",
           ("tests/test_prime.py::test_standard_cells_check_their_padding_and_decode_with_the_last_k_minus_1_inputs",),
           "a standard convolution cell accepting padding_l = kernel_size (no tap on the current position)"),
    Mutant("prime-standard-buffer-one-long", "prime_multi_kernel_conv",
           '{"input_buffer": window[-(K - 1):]})',
           '{"input_buffer": window[-(K + 1):]})',
           ("tests/test_prime.py::test_standard_cells_check_their_padding_and_decode_with_the_last_k_minus_1_inputs",),
           "a standard convolution keeping two inputs more than its window needs while decoding"),
    Mutant("prime-standard-width-one-keeps-every-input", "prime_multi_kernel_conv",
           "            if K > 1:\n                self.set_incremental_state(incremental_state, \"conv_state\"",
           "            if K >= 1:\n                self.set_incremental_state(incremental_state, \"conv_state\"",
           ("tests/test_prime.py::test_standard_cells_check_their_padding_and_decode_with_the_last_k_minus_1_inputs",),
           "a width-1 standard convolution keeping every decoded input in its buffer (window[-0:] is all of it)"),
    Mutant("prime-heads-divide-standard-channels", "prime_multi_kernel_conv",
           'if conv_type == "dynamic" and channels % num_heads != 0:',
           'if conv_type != "dynamic" and channels % num_heads != 0:',
           ("tests/test_prime.py::test_only_dynamic_cells_need_channels_divisible_by_the_heads",),
           "the standard convolution's ablation refused for channels the (unused) heads do not divide"),
    Mutant("prime-step-kernel-joint-path-with-gradient", "prime_multi_kernel_conv",
           "if torch.is_grad_enabled() or (self.training and self.cells[0].weight_dropout > 0) or compiling():",
           "if torch.is_grad_enabled() and (self.training and self.cells[0].weight_dropout > 0) or compiling():",
           ("tests/test_prime.py::test_a_decoding_steps_kernel_is_eq7s_on_both_paths",),
           "a decoding step with a gradient taking the cached, detached joint predictor (no gradient to the cells)"),
    Mutant("prime-step-kernel-no-dropconnect-without-gradient", "prime_multi_kernel_conv",
           "if torch.is_grad_enabled() or (self.training and self.cells[0].weight_dropout > 0) or compiling():",
           "if torch.is_grad_enabled() or (self.training and self.cells[0].weight_dropout > 0) and compiling():",
           ("tests/test_prime.py::test_a_decoding_steps_kernel_is_eq7s_on_both_paths",),
           "a training step without a gradient skipping DropConnect (the joint predictor draws none)"),
    Mutant("prime-step-kernel-ungated-cells", "prime_multi_kernel_conv",
           "                if gates is not None:\n                    w = w * gates[i]",
           "                if gates is None:\n                    w = w * gates[i]",
           ("tests/test_prime.py::test_a_decoding_steps_kernel_is_eq7s_on_both_paths",),
           "a decoding step with a gradient summing the cells' kernels without Eq. 7's gates"),
    Mutant("prime-step-kernel-softmax-over-heads", "prime_multi_kernel_conv",
           "w = F.softmax(cell.weight_linear(x).view(B, H, cell.kernel_size), dim=-1)",
           "w = F.softmax(cell.weight_linear(x).view(B, H, cell.kernel_size), dim=1)",
           ("tests/test_prime.py::test_a_decoding_steps_kernel_is_eq7s_on_both_paths",),
           "a decoding step with a gradient normalising each cell's kernel over the heads, not its taps"),
    Mutant("umst-gat-other-words", "umst_layer",
           "same = (groups.unsqueeze(2) == groups.unsqueeze(1)) & groups.gt(0).unsqueeze(1)",
           "same = (groups.unsqueeze(2) != groups.unsqueeze(1)) & groups.gt(0).unsqueeze(1)",
           ("tests/test_umst.py::test_the_gat_ablation_is_a_single_head_gat_over_each_words_pieces",),
           "the GAT ablation attending the pieces of the other words instead of its own word's"),
    Mutant("umst-gat-softmax-over-queries", "umst_layer",
           "alpha = F.dropout(torch.softmax(scores, dim=-1), p=self.activation_dropout",
           "alpha = F.dropout(torch.softmax(scores, dim=1), p=self.activation_dropout",
           ("tests/test_umst.py::test_the_gat_ablation_is_a_single_head_gat_over_each_words_pieces",),
           "the GAT ablation normalising its attention over the queries, not the neighbours"),
    Mutant("umst-gat-scores-float32", "umst_layer",
           'scores = F.leaky_relu(upcast_half(scores), 0.2)',
           'scores = F.leaky_relu(scores.float(), 0.2)',
           ("tests/test_umst.py::test_the_gat_ablation_is_a_single_head_gat_over_each_words_pieces",),
           "the GAT ablation's scores cast to float32 for every input, float64 too"),
    Mutant("umst-layer-no-phrase-gcn-by-default", "umst_layer",
           "        inter_group=True,",
           "        inter_group=False,",
           ("tests/test_umst_lean.py::test_the_layer_reads_only_the_pooling_operator_built_for_it_and_its_reference_form_runs_nothing_lean",),
           "a UMST layer built with its defaults leaving out the phrase GCN"),
    Mutant("umst-layer-shared-qk-by-default", "umst_layer",
           "        share_rsan_qk=False,",
           "        share_rsan_qk=True,",
           ("tests/test_umst_lean.py::test_the_layer_reads_only_the_pooling_operator_built_for_it_and_its_reference_form_runs_nothing_lean",),
           "a UMST layer built with its defaults sharing the word stream's W_q, W_k (table 6's ablation)"),
    Mutant("umst-layer-shared-gcn-projection-by-default", "umst_layer",
           "        share_within_layer=False,",
           "        share_within_layer=True,",
           ("tests/test_umst_lean.py::test_the_layer_reads_only_the_pooling_operator_built_for_it_and_its_reference_form_runs_nothing_lean",),
           "a UMST layer built with its defaults sharing W_w = W_p (table 6 row 3)"),
    Mutant("umst-layer-share-within-takes-one-cross-projection", "umst_layer",
           "if word_proj is not None or phrase_proj is not None:",
           "if word_proj is not None and phrase_proj is not None:",
           ("tests/test_umst_lean.py::test_the_layer_reads_only_the_pooling_operator_built_for_it_and_its_reference_form_runs_nothing_lean",),
           "share_within_layer silently replacing a cross-layer projection given alone"),
    Mutant("umst-layer-pools-with-the-graphs-mode", "umst_layer",
           "if dense and graphs.down_mode == self.downsample:",
           "if dense or graphs.down_mode == self.downsample:",
           ("tests/test_umst_lean.py::test_the_layer_reads_only_the_pooling_operator_built_for_it_and_its_reference_form_runs_nothing_lean",),
           "a UMST layer pooling words with the batch's operator built for the other down-sampling"),
    Mutant("umst-layer-reference-runs-lean-phrase-gcn", "umst_layer",
           "            if self._lean() and dense:",
           "            if self._lean() or dense:",
           ("tests/test_umst_lean.py::test_the_layer_reads_only_the_pooling_operator_built_for_it_and_its_reference_form_runs_nothing_lean",),
           "the reference and store forms running the lean phrase GCN (its equivalence test then compares it "
           "with itself)"),
    Mutant("transformer-sf-lean-path-under-hooks", "transformer_sf_lean",
           "return not (module._forward_hooks or module._forward_pre_hooks)",
           "return (module._forward_hooks or module._forward_pre_hooks)",
           ("tests/test_transformer_sf_lean.py::test_fairseqs_attention_modules_run_themselves_only_where_a_hook_listens",),
           "TranSFormer's lean path bypassing fairseq's attention exactly where a hook (umst-inspect's) listens on it"),
    Mutant("transformer-sf-lean-path-needs-both-hooks", "transformer_sf_lean",
           "return not (module._forward_hooks or module._forward_pre_hooks)",
           "return not (module._forward_hooks and module._forward_pre_hooks)",
           ("tests/test_transformer_sf_lean.py::test_fairseqs_attention_modules_run_themselves_only_where_a_hook_listens",),
           "TranSFormer's lean path bypassing fairseq's attention where only a forward hook listens on it"),
    Mutant('amp-cache-window-of-another-parameter', "amp_weights",
           'if view.storage_offset() != param.storage_offset() or view.numel() != param.numel():',
           'if view.storage_offset() != param.storage_offset() and view.numel() != param.numel():',
           ("tests/test_amp_weights.py::test_only_a_whole_fp32_parameter_cast_to_the_autocast_dtype_is_taken_and_a_shared_one_is_viewed_under_each_name",),
           "a same-sized window of another parameter's storage taken as a read of the whole parameter"),
    Mutant('amp-cache-slice-is-whole', "amp_weights",
           '        return False\n    dims = lambda',
           '        return True\n    dims = lambda',
           ("tests/test_amp_weights.py::test_only_a_whole_fp32_parameter_cast_to_the_autocast_dtype_is_taken_and_a_shared_one_is_viewed_under_each_name",),
           'a slice of a parameter taken as a read of every element once'),
    Mutant('amp-cache-layout-ignored', "amp_weights",
           'if size != 1)  # noqa: E731',
           'if size == 1)  # noqa: E731',
           ("tests/test_amp_weights.py::test_only_a_whole_fp32_parameter_cast_to_the_autocast_dtype_is_taken_and_a_shared_one_is_viewed_under_each_name",),
           "a parameter's elements in another layout taken as its cast (only dimensions of size 1 compared)"),
    Mutant('amp-cache-any-copy-is-a-cast', "amp_weights",
           'self.reads[ptr].append(func is _TO_COPY and _every_element_once(a, param)',
           'self.reads[ptr].append(func is _TO_COPY or _every_element_once(a, param)',
           ("tests/test_amp_weights.py::test_only_a_whole_fp32_parameter_cast_to_the_autocast_dtype_is_taken_and_a_shared_one_is_viewed_under_each_name",),
           "any copy of a parameter (a cast to float64 too) taken as autocast's cast"),
    Mutant('amp-cache-any-op-in-the-dtype-is-a-cast', "amp_weights",
           '                                               and kwargs.get("dtype") == self.dtype)',
           '                                               or kwargs.get("dtype") == self.dtype)',
           ("tests/test_amp_weights.py::test_only_a_whole_fp32_parameter_cast_to_the_autocast_dtype_is_taken_and_a_shared_one_is_viewed_under_each_name",),
           "any op asked for the autocast dtype (a sum in bf16) taken as autocast's cast"),
    Mutant('amp-cache-records-other-dtypes', "amp_weights",
           'if p.dtype == torch.float32 and p.requires_grad]',
           'if p.dtype == torch.float32 or p.requires_grad]',
           ("tests/test_amp_weights.py::test_only_a_whole_fp32_parameter_cast_to_the_autocast_dtype_is_taken_and_a_shared_one_is_viewed_under_each_name",),
           'the cast cache recording parameters that are not float32 (a float64 one cast by hand)'),
    Mutant('amp-cache-shared-parameter-one-name', "amp_weights",
           'self.names = [n for n, p in self.model.named_parameters(remove_duplicate=False)',
           'self.names = [n for n, p in self.model.named_parameters(remove_duplicate=True)',
           ("tests/test_amp_weights.py::test_only_a_whole_fp32_parameter_cast_to_the_autocast_dtype_is_taken_and_a_shared_one_is_viewed_under_each_name",),
           'a parameter shared under two names cached under its first name only'),
    Mutant('amp-cache-parameters-miss-shared-names', "amp_weights",
           '        params = dict(self.model.named_parameters(remove_duplicate=False))\n        return list(',
           '        params = dict(self.model.named_parameters(remove_duplicate=True))\n        return list(',
           ("tests/test_amp_weights.py::test_only_a_whole_fp32_parameter_cast_to_the_autocast_dtype_is_taken_and_a_shared_one_is_viewed_under_each_name",),
           'the cached parameters looked up without their second names (a shared one fails)'),
    Mutant('amp-cache-cast-misses-shared-names', "amp_weights",
           '        params = dict(self.model.named_parameters(remove_duplicate=False))\n        weights =',
           '        params = dict(self.model.named_parameters(remove_duplicate=True))\n        weights =',
           ("tests/test_amp_weights.py::test_only_a_whole_fp32_parameter_cast_to_the_autocast_dtype_is_taken_and_a_shared_one_is_viewed_under_each_name",),
           "the cast looked up without a shared parameter's second name"),
    Mutant('amp-cache-layerdrop-of-zero', "amp_weights",
           'isinstance(m, LayerDropModuleList) and m.p > 0 for',
           'isinstance(m, LayerDropModuleList) and m.p >= 0 for',
           ("tests/test_amp_weights.py::test_only_a_whole_fp32_parameter_cast_to_the_autocast_dtype_is_taken_and_a_shared_one_is_viewed_under_each_name",),
           'a LayerDrop list of p = 0 taken as dropping layers'),
    Mutant("msc-stacked-states-shape-ignored", "msc_encoder",
           "                or t.stride() != states.stride()[1:]):",
           "                and t.stride() != states.stride()[1:]):",
           ("tests/test_msc_lean.py::test_stacked_states_reorder_and_edited_lists",),
           "MSC's reorder taking the stacked states where an entry was replaced by a narrower view at its address"),
    Mutant("umst-encoder-keeps-every-state", "umst_encoder",
           "return_all_hiddens: bool = False,",
           "return_all_hiddens: bool = True,",
           ("tests/test_umst.py::test_the_encoder_keeps_no_layer_states_where_fairseqs_generator_calls_it",),
           "UMST's encoder keeping every layer's states where fairseq's generator calls it (beam search reorders them)"),
    Mutant("group-ids-of-three-dims-taken", "group_gcn",
           "if group_ids.dim() != 2 or group_ids.size(0) != batch",
           "if group_ids.dim() != 2 and group_ids.size(0) != batch",
           ("tests/test_group_gcn.py::test_bad_group_ids_raise",),
           "group ids of one dimension too many taken when their first two sizes fit"),
    Mutant("group-mean-reads-an-empty-batch", "group_gcn",
           "int(group_ids.max().item()) + 1 if group_ids.numel() > 0 else 1",
           "int(group_ids.max().item()) + 1 if group_ids.numel() >= 0 else 1",
           ("tests/test_group_gcn.py::test_an_empty_batch_passes_through",),
           "the segment mean reading the largest id of an empty batch (an error)"),
    Mutant("group-gcn-rereads-the-bound", "group_gcn",
           "        if num_groups is None and group_ids.numel() > 0:",
           "        if group_ids.numel() > 0:",
           ("tests/test_group_gcn.py::test_the_block_reads_no_ids_when_given_their_bound",),
           "the GCN block reading the ids (a host-device sync) where the encoder gave their bound"),
    Mutant("msmsa-encoder-heads-causal", "msmsa_layer",
           'dropout=cfg.attention_dropout, causal=False, min_block',
           'dropout=cfg.attention_dropout, causal=True, min_block',
           ('tests/test_msmsa.py::test_the_encoder_heads_look_both_ways',),
           "the encoder's multi-scale heads built causal, as the decoder's (no right context)"),
    Mutant("msmsa-attention-weights-by-default", "msmsa_layer",
           'need_weights: bool = False, static_kv',
           'need_weights: bool = True, static_kv',
           ('tests/test_msmsa.py::test_the_attention_follows_fairseqs_call_signature',),
           "the attention computing its weights where no caller asked (fairseq's layers pass no need_weights)"),
    Mutant("msmsa-attention-takes-another-key", "msmsa_layer",
           'if (key is not None and key is not query) or (value',
           'if (key is not None and key is not query) and (value',
           ('tests/test_msmsa.py::test_the_attention_follows_fairseqs_call_signature',),
           'the attention taking another key where the value is the query (it attends to the query alone)'),
    Mutant("msmsa-weights-only-with-head-weights", "msmsa_layer",
           'need_weights=need_weights or need_head_weights)',
           'need_weights=need_weights and need_head_weights)',
           ('tests/test_msmsa.py::test_the_attention_follows_fairseqs_call_signature',),
           'the attention returning no averaged weights where only need_weights asks for them'),
    Mutant("msmsa-encoder-layer-without-ffn-by-default", "msmsa_layer",
           'no_ffn: bool = False,',
           'no_ffn: bool = True,',
           ('tests/test_msmsa.py::test_layers_built_directly_take_the_papers_defaults',),
           "the encoder layer built without its FFN by default (Eq. 10's layer is the ablation)"),
    Mutant("msmsa-decoder-takes-bias-kv-alone", "msmsa_layer",
           'if add_bias_kv or add_zero_attn or cfg',
           'if add_bias_kv and add_zero_attn or cfg',
           ('tests/test_msmsa.py::test_layers_built_directly_take_the_papers_defaults',),
           "the causal multi-scale self-attention built with fairseq's bias_kv (or zero_attn) alone, which it ignores"),
    Mutant("side-inputs-one-missing-taken", "side_inputs",
           'if word_ids is None or word_heads is None:',
           'if word_ids is None and word_heads is None:',
           ('tests/test_umst.py::test_side_input_errors_are_clear',),
           "one side input missing alone passing the shape check (an attribute error follows, not the contract's message)"),
    Mutant("side-input-heads-of-three-dims-taken", "side_inputs",
           'if word_heads.dim() != 2 or word_heads.size(0)',
           'if word_heads.dim() != 2 and word_heads.size(0)',
           ('tests/test_umst.py::test_side_input_errors_are_clear',),
           'word heads of one dimension too many taken when their batch size fits'),
    Mutant("attention-default-scale-over-heads", "common_attention",
           'scale = q.size(-1) ** -0.5 if scale is None',
           'scale = q.size(1) ** -0.5 if scale is None',
           ('tests/test_attention.py::test_the_default_scale_is_one_over_the_root_of_the_head_dim',),
           "the explicit core's default scale 1 / sqrt of the head count, not of the head dimension"),
    Mutant("attention-additive-mask-left-uncast", "common_attention",
           'and mask.dtype != q.dtype:',
           'and mask.dtype == q.dtype:',
           ('tests/test_attention.py::test_an_additive_mask_of_another_dtype_is_cast_to_the_inputs',),
           "an additive mask of another dtype than the inputs handed to torch's fused attention uncast (refused for float64)"),
    Mutant("attention-cpu-bf16-explicit-without-dropout", "common_attention",
           'return dropout_p > 0 and runs_cpu_kernels(q)',
           'return dropout_p >= 0 and runs_cpu_kernels(q)',
           ('tests/test_attention.py::test_cpu_bf16_without_dropout_stays_fused',),
           "CPU bf16 attention without dropout taking the explicit core, not torch's flash kernel"),
    Mutant("attention-recomputed-without-dropout", "common_attention",
           'if recompute and dropout_p > 0 and',
           'if recompute and dropout_p >= 0 and',
           ('tests/test_attention.py::test_only_dropout_in_training_recomputes_the_core',),
           'the attention core recomputed in backward without dropout, where the fused kernel keeps nothing to recompute'),
    Mutant("grad-norms-recorded-when-not-told", "msc_grad_norms",
           'if self.recording and param.grad is not None:',
           'if param.grad is not None:',
           ('tests/test_msc.py::test_grad_norm_logger_numbers_its_updates_keeps_its_interval_and_records_only_when_told',),
           'the figure-5 logger recording gradients where the model did not tell it to (before training, in evaluation)'),
    Mutant("grad-norms-every-record-update-one", "msc_grad_norms",
           'update = (self.update or 0) + 1',
           'update = (self.update and 0) + 1',
           ('tests/test_msc.py::test_grad_norm_logger_numbers_its_updates_keeps_its_interval_and_records_only_when_told',),
           'every figure-5 record numbered update 1'),
    Mutant("grad-norms-interval-ignored", "msc_grad_norms",
           'if update % self.interval != 0 or distributed',
           'if update % self.interval != 0 and distributed',
           ('tests/test_msc.py::test_grad_norm_logger_numbers_its_updates_keeps_its_interval_and_records_only_when_told',),
           'the figure-5 logger writing every update on rank 0, whatever --encoder-grad-norms-interval'),
    Mutant("grad-norms-divided-by-zero-weight", "msc_grad_norms",
           '(weight if weight > 0 else 1.0)',
           '(weight if weight >= 0 else 1.0)',
           ('tests/test_msc.py::test_grad_norm_logger_numbers_its_updates_keeps_its_interval_and_records_only_when_told',),
           'the figure-5 norms divided by a loss weight of 0 (written as null)'),
    Mutant("prime-conv-heads-flag-ignored", "prime_config",
           'conv_heads=args.prime_conv_heads or heads,',
           'conv_heads=args.prime_conv_heads and heads,',
           ('tests/test_prime.py::test_fairseqs_layer_options_reach_prime_layers',),
           "--prime-conv-heads ignored: every layer's convolution takes the attention heads"),
    Mutant("prime-activation-fn-always-relu", "prime_config",
           'getattr(args, "activation_fn", "relu") or "relu"',
           'getattr(args, "activation_fn", "relu") and "relu"',
           ('tests/test_prime.py::test_fairseqs_layer_options_reach_prime_layers',),
           "Prime's FFN activation ReLU whatever --activation-fn names"),
    Mutant("prime-old-relu-dropout-ignored", "prime_config",
           'or getattr(args, "relu_dropout", 0.0) or 0.0',
           'or getattr(args, "relu_dropout", 0.0) and 0.0',
           ('tests/test_prime.py::test_fairseqs_layer_options_reach_prime_layers',),
           'the FFN activation dropout of older args (relu_dropout) dropped'),
    Mutant("prime-offload-activations-alone-taken", "prime_config",
           'getattr(args, "checkpoint_activations", False) or getattr',
           'getattr(args, "checkpoint_activations", False) and getattr',
           ('tests/test_prime.py::test_invalid_flags_give_clear_errors',),
           "--offload-activations alone taken, which Prime's layers do not implement"),
    Mutant("prime-conv-heads-checked-without-convolution", "prime_config",
           '    if args.prime_conv_type != "none":\n        parse_kernel_list',
           '    if args.prime_conv_type == "none":\n        parse_kernel_list',
           ('tests/test_prime.py::test_invalid_flags_give_clear_errors',),
           'the convolution heads and kernels checked only where there is no convolution'),
    Mutant("prime-decoder-input-dim-unchecked", "prime_config",
           'if args.encoder_embed_dim != args.decoder_embed_dim and getattr(args, "decoder_input_dim", None) not in (',
           'if args.encoder_embed_dim != args.decoder_embed_dim and getattr(args, "decoder_input_dim", None) in (',
           ('tests/test_prime.py::test_a_decoder_input_dim_of_its_own_is_refused_where_the_sides_differ',),
           "a decoder input width of its own taken where the two sides' widths differ"),
    Mutant("prime-unfused-by-default", "prime_config",
           'getattr(args, "prime_unfused_projections", False)',
           'getattr(args, "prime_unfused_projections", True)',
           ('tests/test_prime.py::test_prime_defaults_fill_args_that_name_no_prime_option',),
           'args without the option (older checkpoints) projecting branch by branch, the slow path'),
    Mutant("prime-standard-convolution-heads-checked", "prime_config",
           'if _side_conv_type(args, side) != "dynamic":',
           'if _side_conv_type(args, side) is None:',
           ('tests/test_prime.py::test_the_options_ask_heads_that_divide_the_width_only_of_a_dynamic_convolution',),
           "heads that do not divide the width refused for table 6's standard convolution, which has none"),
    Mutant("prime-heads-check-blind-to-ablation-scope", "prime_config",
           'if _side_conv_type(args, side) != "dynamic":',
           'if args.prime_conv_type != "dynamic":',
           ('tests/test_prime.py::test_the_options_ask_heads_that_divide_the_width_only_of_a_dynamic_convolution',),
           "the heads left unchecked on the side --prime-ablation-scope keeps dynamic"),
    Mutant("msc-loss-hooked-without-penalty", "msc_model",
           "return self.training and (self.encoder_l2 > 0 or",
           "return self.training and (self.encoder_l2 >= 0 or",
           ('tests/test_msc.py::test_the_loss_is_hooked_only_in_training_with_a_penalty_or_a_logger',),
           "a plain MSC model's training loss hooked by a zero penalty, so --compile never compiles it"),
    Mutant("msc-loss-term-on-probabilities", "msc_model",
           "if not (self._hooks_log_probs() and log_probs and lprobs.requires_grad):",
           "if not (self._hooks_log_probs() and lprobs.requires_grad):",
           ('tests/test_msc.py::test_the_loss_is_hooked_only_in_training_with_a_penalty_or_a_logger',),
           "the L2 penalty and the logger's hook put on probabilities, not only log-probabilities"),
    Mutant("msc-generator-output-without-extra-refused", "msc_model",
           "if len(net_output) > 1 and isinstance(net_output[1], dict) else {}",
           "if len(net_output) > 1 else {}",
           ('tests/test_msc.py::test_the_loss_is_hooked_only_in_training_with_a_penalty_or_a_logger',),
           "a net output whose extra is None (fairseq's sequence generator's) failing in training"),
    Mutant("msc-grad-norms-file-in-working-dir", "msc_model",
           'getattr(args, "save_dir", None) or "."',
           '"."',
           ('tests/test_msc.py::test_the_grad_norms_file_defaults_to_the_save_dir',),
           "the figure-5 gradient norms written to the working directory, not the save dir"),
    Mutant("msc-target-positions-not-the-tasks", "msc_model",
           'if getattr(args, "max_target_positions", None) is None:',
           "if True:",
           ('tests/test_msc.py::test_the_model_keeps_the_tasks_max_positions_and_asks_no_encoder_states',),
           "--max-target-positions overridden by 1024"),
    Mutant("msc-encoder-states-kept-by-default", "msc_model",
           "        return_all_hiddens: bool = False,",
           "        return_all_hiddens: bool = True,",
           ('tests/test_msc.py::test_the_model_keeps_the_tasks_max_positions_and_asks_no_encoder_states',),
           "every encoder layer's output kept by the model's forward unless told otherwise"),
    Mutant("msc-shared-embedding-path-check-inverted", "msc_model",
           "args.decoder_embed_path != args.encoder_embed_path:",
           "args.decoder_embed_path == args.encoder_embed_path:",
           ('tests/test_msc.py::test_shared_embeddings_take_one_pretrained_file',),
           "with --share-all-embeddings, the same pretrained file refused for the decoder and another one taken"),
    Mutant("sf-last-interaction-layer-refused", "transformer_sf_config",
           "if not 1 <= i <= num_layers]",
           "if not 1 <= i < num_layers]",
           ('tests/test_transformer_sf.py::test_interaction_layer_specs',),
           "--sf-interaction-layers refusing the top layer's id N in a list (1..N-1 taken)"),
    Mutant("sf-stack-config-fast-heads-not-the-archs", "transformer_sf_config",
           "    fast_heads: int = 2",
           "    fast_heads: int = 4",
           ('tests/test_transformer_sf.py::test_the_stack_config_defaults_are_the_base_archs',),
           "a stack built directly with 4 character heads where the archs give H_f / 16 = 2"),
    Mutant("sf-decoder-post-norm-by-default", "transformer_sf_config",
           'getattr(args, "decoder_normalize_before", True)',
           'getattr(args, "decoder_normalize_before", False)',
           ('tests/test_transformer_sf.py::test_the_stack_config_defaults_are_the_base_archs',),
           "TranSFormer's decoders post-norm where its encoders are pre-norm"),
    Mutant("sf-bare-args-without-boundary-pe", "transformer_sf_config",
           'getattr(args, "no_boundary_pe", False)',
           'getattr(args, "no_boundary_pe", True)',
           ('tests/test_transformer_sf.py::test_the_stack_config_defaults_are_the_base_archs',),
           "args without TranSFormer's options (older checkpoints) dropping the boundary-wise relative PE"),
    Mutant("sf-random-boundary-place-shifted", "transformer_sf_encoder",
           "pos = torch.cumsum(valid.long(), dim=1) - 1",
           "pos = torch.cumsum(valid.long(), dim=1) + 1",
           ('tests/test_transformer_sf.py::test_random_boundaries_hash_each_characters_place_in_its_sentence',),
           "--random-char-boundary hashing each character's place from 2, so no sentence's first character is forced to start a word"),
    Mutant("sf-character-positions-dropped", "transformer_sf_encoder",
           "if encoder.embed_fast_positions is not None:",
           "if encoder.embed_fast_positions is None:",
           ('tests/test_transformer_sf.py::test_the_character_branch_reads_scaled_embeddings_plus_sinusoidal_positions',),
           "the character branch's input without its sinusoidal positions"),
    Mutant("sf-max-positions-without-embeddings-fails", "transformer_sf_encoder",
           "if self.embed_positions is None:\n            return self.max_source_positions",
           "if self.embed_positions is not None:\n            return self.max_source_positions",
           ('tests/test_transformer_sf.py::test_the_encoder_out_carries_the_source_lengths_and_its_max_positions',),
           "max_positions failing under --no-token-positional-embeddings"),
    Mutant("sf-encoder-out-without-source-lengths", "transformer_sf_encoder",
           '"src_lengths": [src_lengths] if src_lengths is not None else [],',
           '"src_lengths": [],',
           ('tests/test_transformer_sf.py::test_the_encoder_out_carries_the_source_lengths_and_its_max_positions',),
           "the encoder-out dict dropping the source lengths it was given"),
    Mutant("sf-compiled-inputs-reread-char-length", "transformer_sf_encoder",
           'if src_char_len is None and self.fast_input == "char" and is_compiled(self.inputs):',
           'if self.fast_input == "char" and is_compiled(self.inputs):',
           ('tests/test_transformer_sf.py::test_the_host_reads_the_character_length_only_for_compiled_inputs_not_told_it',),
           "compiled inputs reading the character length off the device though the collater gave it (a host sync per batch)"),
    Mutant("hub-record-noted-per-sentence", "hub",
           "        self._noted_raw_input = True\n",
           "        self._noted_raw_input = False\n",
           ("tests/test_loader.py::test_raw_input_under_fairseqs_translation_task_notes_the_record_once",),
           "the hub logging the data-bin's preprocessing again for every sentence encoded"),
    Mutant("hub-plain-task-mode-inverted", "hub",
           'elif self._mode == "record":',
           'elif self._mode != "record":',
           ("tests/test_loader.py::test_raw_input_under_fairseqs_translation_task_notes_the_record_once",),
           "under fairseq's translation task, the record noted only with text_preprocessing='arguments'"),
    Mutant("hub-record-presence-inverted", "hub",
           "            if self._record is not None:",
           "            if self._record is None:",
           ("tests/test_loader.py::test_raw_input_under_fairseqs_translation_task_notes_the_record_once",),
           "under fairseq's translation task, a data-bin with a record warned of as having none"),
    Mutant("hub-translate-verbose", "hub",
           "def translate(self, sentences, beam=DEFAULT_BEAM, verbose=False, **kwargs):",
           "def translate(self, sentences, beam=DEFAULT_BEAM, verbose=True, **kwargs):",
           ("tests/test_loader.py::test_raw_input_under_fairseqs_translation_task_notes_the_record_once",),
           "the hub's translate logging every source, hypothesis and positional score by default"),
    Mutant("umst-operator-uncast", "umst_lean_gcn",
           "if t.dtype == like.dtype or torch.is_autocast_enabled(like.device.type):",
           "if t.dtype != like.dtype or torch.is_autocast_enabled(like.device.type):",
           ("tests/test_umst_lean.py::test_attention_reads_only_the_dense_operators_built_for_it",),
           "a dense graph operator of another dtype than the activations left uncast outside autocast"),
    Mutant("umst-attention-shared-qk-by-default", "umst_attention",
           "        share_qk=False,\n",
           "        share_qk=True,\n",
           ("tests/test_umst_lean.py::test_attention_reads_only_the_dense_operators_built_for_it",),
           "the rectified attention built alone sharing the subword W_q, W_k with the word stream (table 6's ablation)"),
    Mutant("umst-attention-other-norm-operators", "umst_attention",
           "if self.reference or graphs.up is None or graphs.proj_norm != self.upsample_norm:",
           "if self.reference or graphs.up is None and graphs.proj_norm != self.upsample_norm:",
           ("tests/test_umst_lean.py::test_attention_reads_only_the_dense_operators_built_for_it",),
           "the rectified attention reading dense operators built for the other up-sampling normalisation"),
)


def problems(root=ROOT, mutants=MUTANTS):
    """What is wrong with the table against the files under ``root``: a file that is not there, a snippet that
    does not occur exactly once, a fault equal to its snippet, a name used twice, a test file or test function
    that does not exist."""
    found = []
    names = [m.name for m in mutants]
    found += [f"{n}: the name is used twice" for n in sorted({n for n in names if names.count(n) > 1})]
    for m in mutants:
        if m.file not in FILES:
            found.append(f"{m.name}: no file {m.file!r} in FILES")
            continue
        path = os.path.join(root, FILES[m.file])
        if not os.path.isfile(path):
            found.append(f"{m.name}: {FILES[m.file]} does not exist")
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for original, faulty in m.replacements():
            count = text.count(original)
            if count != 1:
                found.append(f"{m.name}: its snippet occurs {count} times in {FILES[m.file]}, not once")
            if faulty == original:
                found.append(f"{m.name}: the fault is the snippet itself")
        for arg in m.tests:
            if not arg.startswith("tests/"):
                continue
            test_file, _, function = arg.partition("::")
            test_path = os.path.join(root, test_file)
            if not os.path.isfile(test_path):
                found.append(f"{m.name}: {test_file} does not exist")
                continue
            with open(test_path, encoding="utf-8") as f:
                text = f.read()
            function = function.split("[")[0]
            if function and not re.search(rf"^def {re.escape(function)}\(", text, flags=re.M):
                found.append(f"{m.name}: {test_file} has no test {function}")
    return found


@contextlib.contextmanager
def planted(root, mutant):
    """``mutant``'s fault written into its file under ``root`` (a copy of the repository); the original text back
    on leaving, whatever happens inside."""
    path = os.path.join(root, FILES[mutant.file])
    with open(path, encoding="utf-8") as f:
        text = f.read()
    faulty_text = text
    for original, faulty in mutant.replacements():
        if faulty_text.count(original) != 1:
            raise ValueError(f"{mutant.name}: its snippet occurs {faulty_text.count(original)} times in "
                             f"{FILES[mutant.file]}, not once")
        faulty_text = faulty_text.replace(original, faulty)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(faulty_text)
        yield path
    finally:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def copy_of_repository(source, destination):
    """The files git knows under ``source`` (tracked, and untracked ones it does not ignore) copied to
    ``destination``; returns how many."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=source,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    count = 0
    for name in filter(None, listed):
        src = os.path.join(source, name)
        if not os.path.isfile(src) or os.path.islink(src):
            continue
        dst = os.path.join(destination, name)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)
        count += 1
    return count


def _environment(copy):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env["PYTHONPATH"] = copy + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a restored file is never run from a mutant's bytecode
    return env


def run_tests(copy, tests, timeout, python=sys.executable):
    """``pytest -n 0 -x`` of ``tests`` in ``copy``: (status, seconds, failed test ids, the output's tail)."""
    command = [python, "-m", "pytest", "-n", "0", "-x", "-q", "-p", "no:cacheprovider", *tests]
    start = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=copy, env=_environment(copy), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return "timeout", time.monotonic() - start, [], out[-3000:]
    out = proc.stdout + proc.stderr
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, flags=re.M)
    return proc.returncode, time.monotonic() - start, failed, out[-3000:]


def _verdict(status):
    if status == 1:
        return "caught"
    if status == 0:
        return "survived"
    return "timeout" if status == "timeout" else f"error (pytest status {status})"


def check(mutants=MUTANTS, root=ROOT, timeout=900, log=print):
    """Run the check (module docstring); returns the record written by ``--json``."""
    wrong = problems(root, mutants)
    if wrong:
        raise ValueError("the mutation table does not fit the code:\n  " + "\n  ".join(wrong))
    started, start = time.strftime("%Y-%m-%d %H:%M:%S"), time.monotonic()
    commit = _commit(root)  # (the code copied now: the checkout may move on while the check runs)
    results, baseline = [], []
    copy = tempfile.mkdtemp(prefix="umst-mutation-")
    try:
        n = copy_of_repository(root, copy)
        log(f"[mutation] {n} files copied to {copy}; the checkout is not written")
        for tests in dict.fromkeys(m.tests for m in mutants):  # each distinct set once, unchanged code
            status, seconds, failed, tail = run_tests(copy, tests, timeout)
            baseline.append(dict(tests=list(tests), status=status, seconds=round(seconds, 1)))
            log(f"[mutation] unchanged code: {' '.join(tests)}: pytest status {status} in {seconds:.0f} s")
            if status != 0:
                raise RuntimeError(f"the tests {' '.join(tests)} fail on the unchanged code (status {status}); "
                                   f"a fault they catch would mean nothing:\n{tail}")
        for m in mutants:
            with planted(copy, m):
                status, seconds, failed, tail = run_tests(copy, m.tests, timeout)
            verdict = _verdict(status)
            results.append(dict(name=m.name, file=FILES[m.file], fault=m.fault, tests=list(m.tests),
                                verdict=verdict, seconds=round(seconds, 1), failed=failed[:5]))
            log(f"[mutation] {m.name}: {verdict} in {seconds:.0f} s" + (f" ({failed[0]})" if failed else ""))
            if verdict.startswith("error"):
                log(tail)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    return dict(started=started, seconds=round(time.monotonic() - start), machine=machine(), commit=commit,
                command="python -m umst_dev.mutation", baseline=baseline, results=results)


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def _commit(root):
    """HEAD's short hash, with ``+changes`` where the tree the check copies differs from it (changed or untracked
    files that git does not ignore); None outside a git checkout."""
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    commit = proc.stdout.strip() or None
    status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True)
    return commit + "+changes" if commit and status.stdout.strip() else commit


def merge(record, update, mutants=MUTANTS):
    """``record`` with the results of ``update`` (a later run of some faults) in place of its own, each marked with
    the update's commit, start and machine; in the order of ``mutants``, those no longer in it left out. The
    update's baseline runs are added to the record's."""
    ran = {r["name"]: dict(r, commit=update["commit"], started=update["started"], machine=update["machine"])
           for r in update["results"]}
    kept = {r["name"]: r for r in record["results"]}
    kept.update(ran)
    merged = dict(record, results=[kept[m.name] for m in mutants if m.name in kept],
                  baseline=record.get("baseline", []) + update.get("baseline", []))
    merged["updates"] = record.get("updates", []) + [dict(
        started=update["started"], seconds=update["seconds"], machine=update["machine"], commit=update["commit"],
        faults=sorted(ran))]
    return merged


def markdown(record):
    lines = [f"Mutation check, commit {record['commit']}, {record['machine']}: {record['seconds']} s "
             f"(`{record['command']}`)."]
    for u in record.get("updates", []):
        lines.append(f"Updated with `--update`: {len(u['faults'])} fault(s) at commit {u['commit']}, {u['machine']}, "
                     f"{u['seconds']} s.")
    lines += ["", "| fault | file | verdict | seconds | first failing test |", "|---|---|---|---:|---|"]
    for r in record["results"]:
        first = r["failed"][0].split("::")[-1] if r["failed"] else ""
        at = f" (commit {r['commit']})" if r.get("commit", record["commit"]) != record["commit"] else ""
        lines.append(f"| {r['name']}: {r['fault']} | `{r['file']}` | {r['verdict']}{at} | {r['seconds']:.0f} | "
                     f"{first} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m umst_dev.mutation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these faults only (names: --list)")
    parser.add_argument("--list", action="store_true", help="print the table and exit")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per pytest run (default 900)")
    parser.add_argument("--json", help="write the record here")
    parser.add_argument("--markdown", help="write the table of results here")
    parser.add_argument("--update", metavar="RECORD",
                        help="run the faults this record (a --json file) lacks, or those of --only, and write their "
                             "results into it (the markdown table: --markdown)")
    args = parser.parse_args(argv)
    mutants = MUTANTS
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in MUTANTS})
        if unknown:
            parser.error(f"no fault named {', '.join(unknown)} (see --list)")
        mutants = tuple(m for m in MUTANTS if m.name in args.only)
    previous = None
    if args.update:
        try:
            with open(args.update, encoding="utf-8") as f:
                previous = json.load(f)
            recorded = {r["name"] for r in previous["results"]}
        except (OSError, ValueError, KeyError, TypeError) as e:
            parser.error(f"--update {args.update}: not a record of this check ({e})")
        if not args.only:
            mutants = tuple(m for m in MUTANTS if m.name not in recorded)
        if not mutants:
            print(f"[mutation] {args.update} has a result for every fault in the table: nothing to run")
            return 0
    if args.list:
        for m in mutants:
            print(f"{m.name}\t{FILES[m.file]}\t{m.fault}\t{' '.join(m.tests)}")
        return 0
    wrong = problems(ROOT, mutants)
    if wrong:
        print("the mutation table does not fit the code:\n  " + "\n  ".join(wrong), file=sys.stderr)
        return 2
    record = check(mutants, timeout=args.timeout, log=lambda s: print(s, flush=True))
    if previous is not None:
        missed_now = {r["name"] for r in record["results"] if r["verdict"] != "caught"}
        record = merge(previous, record)
        args.json = args.json or args.update
    else:
        missed_now = None
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(markdown(record))
    print(markdown(record))
    missed = [r["name"] for r in record["results"] if r["verdict"] != "caught" and
              (missed_now is None or r["name"] in missed_now)]
    if missed:
        print(f"[mutation] not caught: {', '.join(missed)}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
