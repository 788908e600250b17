"""The plugin's precision flags under any task, fairseq's ``translation`` included, in every CLI
(umst_plugin/training/amp_dtype_flag.py; umst_plugin/patches/task_autocast.py, generate_cli.py, checkpoint_precision.py).

``fairseq-train --user-dir umst_plugin --task translation --arch transformer --amp --amp-dtype bfloat16`` used
to stop with status 2 (``unrecognized arguments: --amp-dtype bfloat16``): the flag belonged to
``multiscale_translation``. Now it is one of fairseq's common options. Checked here: every CLI parser has it
under every task; a transformer under ``--task translation`` multiplies in bf16 in its training, validation and
decoding steps (the dtype of its output projection's matmul, in-process through fairseq's Trainer and
``call_main``); and through the real CLIs on the toy corpus, fairseq-train, -validate, -generate and
-interactive run under bf16 autocast (their log, and results that differ from fp32's), ``--amp`` alone decodes
in the dtype the checkpoint was trained in, and ``--amp-dtype`` without ``--amp`` warns.
"""
import argparse
import os
import re

import pytest
import torch

import e2e
import umst_plugin  # noqa: F401  (installs the patches)
from umst_plugin import mixed_precision

BF16 = ("--amp", "--amp-dtype", "bfloat16")
TINY_TRANSFORMER = dict(encoder_layers=1, decoder_layers=1, encoder_embed_dim=8, decoder_embed_dim=8,
                        encoder_ffn_embed_dim=16, decoder_ffn_embed_dim=16, encoder_attention_heads=2,
                        decoder_attention_heads=2)  # a one-layer transformer of width 8, built in milliseconds
CLI_PARSERS = ("get_training_parser", "get_validation_parser", "get_generation_parser",
               "get_interactive_generation_parser")


# ---- the flag ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("task", ["translation", "multiscale_translation"])
@pytest.mark.parametrize("make", CLI_PARSERS)
def test_every_cli_parser_takes_amp_dtype_under_every_task(make, task, toy_databin):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = [toy_databin, "--user-dir", e2e.PLUGIN, "--task", task, "--cpu"]
    argv += ["--arch", "transformer"] if make == "get_training_parser" else ["--path", "checkpoint.pt"]
    args = options.parse_args_and_arch(getattr(options, make)(), input_args=argv + list(BF16))
    assert args.amp and args.amp_dtype == "bfloat16"
    cfg = convert_namespace_to_omegaconf(args)
    assert cfg.common.amp_dtype == "bfloat16"
    assert mixed_precision.configured_amp_dtype(cfg) == "bfloat16"
    default = convert_namespace_to_omegaconf(options.parse_args_and_arch(getattr(options, make)(),
                                                                         input_args=argv + ["--amp"]))
    assert default.common.amp and default.common.amp_dtype is None
    assert mixed_precision.configured_amp_dtype(default) is None


def test_a_wrong_amp_dtype_stops_as_fairseq_flags_do(toy_databin, capsys):
    from fairseq import options

    with pytest.raises(SystemExit) as info:
        options.parse_args_and_arch(options.get_training_parser(), input_args=[
            toy_databin, "--task", "translation", "--arch", "transformer", "--amp", "--amp-dtype", "float8"])
    assert info.value.code == 2
    assert "argument --amp-dtype: invalid choice: 'float8' (choose from" in capsys.readouterr().err


def test_a_parser_built_before_the_plugin_gets_the_flag_from_the_task():
    """A program that builds its parser before ``parse_args_and_arch`` imports ``--user-dir``: the flag comes
    with the task's arguments, for tasks that take fairseq's add_args and for tasks with their own."""
    from fairseq.tasks import TASK_REGISTRY

    for name in ("translation", "multiscale_translation", "translation_multi_simple_epoch"):
        parser = argparse.ArgumentParser(allow_abbrev=False)
        TASK_REGISTRY[name].add_args(parser)
        args, _ = parser.parse_known_args(["data-bin", "--amp-dtype", "bfloat16"])
        assert args.amp_dtype == "bfloat16", name
    parser = argparse.ArgumentParser()
    TASK_REGISTRY["multiscale_translation"].add_args(parser)
    TASK_REGISTRY["multiscale_translation"].add_args(parser)  # twice: still one flag
    assert sum("--amp-dtype" in a.option_strings for a in parser._actions) == 1


def test_the_patches_are_idempotent():
    from fairseq.dataclass.configs import CommonConfig
    from fairseq.tasks.fairseq_task import FairseqTask
    from umst_plugin.patches import checkpoint_precision, generate_cli, task_autocast
    from umst_plugin.training import amp_dtype_flag

    before = (dict(CommonConfig.__dataclass_fields__), CommonConfig.__init__, FairseqTask.valid_step,
              FairseqTask.__dict__["add_args"])
    for patch in (amp_dtype_flag, checkpoint_precision, generate_cli, task_autocast):
        patch.install()
    assert before == (dict(CommonConfig.__dataclass_fields__), CommonConfig.__init__, FairseqTask.valid_step,
                      FairseqTask.__dict__["add_args"])
    assert CommonConfig(amp=True, amp_dtype="bfloat16").amp_dtype == "bfloat16" and CommonConfig().amp_dtype is None


def test_configured_amp_dtype_reads_common_and_the_task_key_of_older_checkpoints():
    from omegaconf import OmegaConf

    assert mixed_precision.configured_amp_dtype(OmegaConf.create({"common": {"amp_dtype": "bfloat16"},
                                                                  "task": {"_name": "translation"}})) == "bfloat16"
    # a multiscale_translation checkpoint stored before the flag was common: task.amp_dtype, no common key
    old = OmegaConf.create({"common": {"amp": True}, "task": {"_name": "multiscale_translation",
                                                              "amp_dtype": "bfloat16"}})
    assert mixed_precision.configured_amp_dtype(old) == "bfloat16"
    assert mixed_precision.configured_amp_dtype(OmegaConf.create({"common": {"amp_dtype": None}})) is None
    assert mixed_precision.configured_amp_dtype(None) is None
    with pytest.raises(ValueError, match="amp_dtype 'float8': expected one of float16, bfloat16"):
        mixed_precision.configured_amp_dtype(OmegaConf.create({"common": {"amp_dtype": "float8"}}))


def test_the_inference_dtype_is_the_callers_then_the_command_lines_then_the_checkpoints(clean_process_record):
    from argparse import Namespace

    task = Namespace(cfg=Namespace(), inference_amp_dtype=None, checkpoint_amp_dtype=None)
    mixed_precision.set_process_amp(True, None)
    assert mixed_precision.inference_amp_dtype(task) == "float16"  # fairseq's --amp
    task.checkpoint_amp_dtype = "bfloat16"
    assert mixed_precision.inference_amp_dtype(task) == "bfloat16"  # --amp alone: the checkpoint's dtype
    task.cfg.amp_dtype = "float16"
    assert mixed_precision.inference_amp_dtype(task) == "float16"  # a multiscale_translation task config
    mixed_precision.set_process_amp(True, "bfloat16")
    assert mixed_precision.inference_amp_dtype(task) == "bfloat16"  # --amp-dtype on this command line
    task.inference_amp_dtype = "float16"
    assert mixed_precision.inference_amp_dtype(task) == "float16"  # from_pretrained(..., amp_dtype=...)


def test_a_loaded_checkpoint_tells_its_task_its_dtype_and_loads_strictly_by_default(tmp_path):
    """``checkpoint_utils.load_model_ensemble_and_task`` as patched (patches/checkpoint_precision.py): the task
    it hands back knows the dtype the checkpoint was trained in (bfloat16 here, None without ``--amp-dtype``),
    and a state dict with a key the model does not have is refused, as fairseq's own loader does by default."""
    from fairseq import checkpoint_utils, tasks

    from umst_dev import dev

    path = str(tmp_path / "checkpoint.pt")
    open(path, "w").close()  # (the loader asks that the file exists; the state is handed to it)
    d = dev.make_dictionary()
    for amp, want in ((dict(amp=True, amp_dtype="bfloat16"), "bfloat16"), ({}, None)):
        cfg = dev.config_of(dev.parse_args("transformer", dict(TINY_TRANSFORMER, **amp)))
        task = tasks.TASK_REGISTRY["multiscale_translation"](cfg.task, d, d)
        model = task.build_model(cfg.model)
        _, _, loaded = checkpoint_utils.load_model_ensemble_and_task([path], task=task,
                                                                     state={"cfg": cfg, "model": model.state_dict()})
        assert loaded is task and task.checkpoint_amp_dtype == want
    stray = dict(model.state_dict(), **{"stray.weight": torch.ones(1)})
    with pytest.raises(RuntimeError, match="Unexpected key.*stray.weight"):
        checkpoint_utils.load_model_ensemble_and_task([path], task=task, state={"cfg": cfg, "model": stray})


def test_a_train_step_called_without_ignore_grad_trains_as_fairseqs_does():
    """The patched ``FairseqTask.train_step`` keeps fairseq's default ``ignore_grad=False``: a caller that leaves it
    out (fairseq's Trainer passes it; other callers need not) gets the gradients of the loss, not of zero."""
    from fairseq.criterions.cross_entropy import CrossEntropyCriterion
    from fairseq.tasks.fairseq_task import FairseqTask

    from umst_dev import dev

    model, task = dev.build_model("transformer", dict(TINY_TRANSFORMER, dropout=0), task="translation")
    criterion = CrossEntropyCriterion(task, sentence_avg=False)
    sample = dev.random_sample(task, 3, 5, 4, seed=0)
    sample["net_input"] = {k: sample["net_input"][k] for k in ("src_tokens", "src_lengths", "prev_output_tokens")}

    class Backward:  # what train_step asks of fairseq's optimizer
        def backward(self, loss):
            loss.backward()

    def gradients(**kwargs):
        model.zero_grad()
        FairseqTask.train_step(task, sample, model, criterion, Backward(), 0, **kwargs)
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    default, explicit = gradients(), gradients(ignore_grad=False)
    assert default and any(g.abs().sum() > 0 for g in default)
    assert all(torch.equal(a, b) for a, b in zip(default, explicit))
    assert all(g.abs().sum() == 0 for g in gradients(ignore_grad=True))


# ---- bf16 matmuls in a transformer under --task translation (in-process) --------------------------------

def test_translation_task_trains_validates_and_decodes_with_bf16_matmuls(toy_databin, clean_process_record):
    """fairseq's transformer under fairseq's translation task, the flags parsed as fairseq-train parses them,
    run through ``call_main`` (the CLIs' entry) and fairseq's Trainer: the output projection (a matmul) returns
    bfloat16 in the training, validation and decoding steps; fp32 without --amp."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.distributed import utils as distributed_utils
    from fairseq.trainer import Trainer

    def output_dtypes(amp_flags):
        argv = [toy_databin, "--user-dir", e2e.PLUGIN, "--task", "translation", "--arch", "transformer",
                "--cpu", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1000", *e2e.TINY, *amp_flags]
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(),
                                                                         input_args=argv))
        seen = {}

        def main(cfg):
            task = tasks.setup_task(cfg.task)
            task.load_dataset("valid")
            dataset = task.dataset("valid")
            sample = dataset.collater([dataset[i] for i in range(4)])
            torch.manual_seed(1)
            model = task.build_model(cfg.model)
            phase = ["train"]

            def record(module, inputs, output):
                seen.setdefault(phase[0], output.dtype)

            model.decoder.output_projection.register_forward_hook(record)
            trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
            trainer.train_step([sample])
            phase[0] = "valid"
            trainer.valid_step(sample)
            phase[0] = "decode"
            generator = task.build_generator([model], argparse.Namespace(beam=2, max_len_b=4))
            task.inference_step(generator, [model], sample)

        distributed_utils.call_main(cfg, main)
        return seen

    assert output_dtypes(BF16) == {"train": torch.bfloat16, "valid": torch.bfloat16, "decode": torch.bfloat16}
    assert output_dtypes(("--amp",)) == {"train": torch.float16, "valid": torch.float16, "decode": torch.float16}
    assert output_dtypes(()) == {"train": torch.float32, "valid": torch.float32, "decode": torch.float32}


# ---- the CLIs under --task translation ----------------------------------------------------------------

def last_update_loss(checkpoint):
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    for _priority, name, _kind, meter in state["extra_state"]["metrics"]["default"]:
        if name == "loss":
            return float(meter["val"])
    raise AssertionError(f"no training loss in {checkpoint}")


@pytest.fixture(scope="module")
def transformer_runs(toy_databin, tmp_path_factory):
    """fairseq's transformer under --task translation, 8 updates with validation: fp32 and bf16 autocast."""
    runs = {}
    for name, extra in (("fp32", ()), ("bf16", BF16)):
        save = str(tmp_path_factory.mktemp(f"translation-{name}"))
        log = e2e.train(toy_databin, save, "transformer", "--cpu", *e2e.TINY, *extra, task="translation",
                        max_update=8, validate=True)
        runs[name] = (os.path.join(save, "checkpoint_last.pt"), log)
    return runs


@pytest.mark.slow
def test_fairseq_train_under_translation_trains_and_validates_in_bf16(transformer_runs):
    (fp32_ckpt, fp32_log), (bf16_ckpt, bf16_log) = transformer_runs["fp32"], transformer_runs["bf16"]
    for line in ("mixed precision: bfloat16 autocast on cpu, loss scale fixed at 1",
                 "mixed precision: training under bfloat16 autocast on cpu",
                 "mixed precision: validation under bfloat16 autocast on cpu"):
        assert line in bf16_log, bf16_log[-3000:]
    assert "mixed precision" not in fp32_log
    fp32, bf16 = last_update_loss(fp32_ckpt), last_update_loss(bf16_ckpt)
    assert fp32 != bf16 and abs(bf16 - fp32) / fp32 < 0.03, (fp32, bf16)
    state = torch.load(bf16_ckpt, map_location="cpu", weights_only=False)
    assert state["cfg"]["common"]["amp_dtype"] == "bfloat16" and state["cfg"]["task"]["_name"] == "translation"


def validate(databin, ckpt, *extra):
    proc = e2e.fairseq("validate", databin, "--user-dir", e2e.PLUGIN, "--task", "translation", "--path", ckpt,
                       "--cpu", "--valid-subset", "valid", "--max-tokens", "1000", *extra)
    return proc.stdout + proc.stderr


def valid_loss(log):
    match = re.search(r"valid on 'valid' subset \| loss ([0-9.]+)", log)
    assert match, log[-3000:]
    return float(match.group(1))


@pytest.mark.slow
def test_fairseq_validate_under_translation(toy_databin, transformer_runs):
    """--amp --amp-dtype X validates under X; --amp alone in the dtype the checkpoint was trained in; no --amp:
    fp32 whatever the checkpoint."""
    ckpt = transformer_runs["bf16"][0]
    plain = validate(toy_databin, ckpt)
    assert "mixed precision" not in plain
    bf16 = validate(toy_databin, ckpt, *BF16)
    assert "validation under bfloat16 autocast on cpu" in bf16
    # (the loss, rounded to 3 decimals in the log, need not move: the matmul dtype of fairseq's valid_step
    # under this patch is checked in-process above)
    assert abs(valid_loss(bf16) - valid_loss(plain)) / valid_loss(plain) < 0.02
    assert "validation under bfloat16 autocast on cpu" in validate(toy_databin, ckpt, "--amp")
    assert "validation under float16 autocast on cpu" in validate(toy_databin, ckpt, "--amp", "--amp-dtype",
                                                                   "float16")
    assert "validation under float16 autocast on cpu" in validate(toy_databin, transformer_runs["fp32"][0], "--amp")


def scores(output):
    return [float(s) for s in re.findall(r"^H-\d+\t([-0-9.e]+)\t", output, flags=re.M)]


@pytest.mark.slow
def test_fairseq_generate_under_translation(toy_raw, toy_databin, transformer_runs):
    ckpt = transformer_runs["bf16"][0]
    fp32 = e2e.generate(toy_databin, ckpt, "--cpu", task="translation")
    bf16 = e2e.generate(toy_databin, ckpt, "--cpu", *BF16, task="translation")
    assert "decoding under bfloat16 autocast on cpu" in bf16 and "mixed precision" not in fp32
    e2e.assert_translated_all(bf16, toy_raw)
    assert len(scores(bf16)) == len(scores(fp32)) and scores(bf16) != scores(fp32)
    assert "decoding under bfloat16 autocast on cpu" in e2e.generate(toy_databin, ckpt, "--cpu", "--amp",
                                                                     task="translation")
    # --amp-dtype without --amp: fp32, and a warning that it does nothing
    alone = e2e.generate(toy_databin, ckpt, "--cpu", "--amp-dtype", "bfloat16", task="translation")
    assert "--amp-dtype bfloat16 has no effect without --amp" in alone and "autocast" not in alone
    assert scores(alone) == scores(fp32)


@pytest.mark.slow
def test_fairseq_interactive_under_translation(toy_raw, toy_databin, transformer_runs):
    ckpt = transformer_runs["bf16"][0]
    with open(os.path.join(toy_raw, f"test.{e2e.SRC}"), encoding="utf-8") as f:
        lines = [next(f).strip() for _ in range(3)]
    out = e2e.interactive(toy_databin, ckpt, lines, "--cpu", *BF16, task="translation")
    assert "decoding under bfloat16 autocast on cpu" in out
    assert len(e2e.hypotheses(out)) == 3, out[-3000:]
    fp32 = e2e.interactive(toy_databin, ckpt, lines, "--cpu", task="translation")
    assert "mixed precision" not in fp32 and scores(fp32) != scores(out)
