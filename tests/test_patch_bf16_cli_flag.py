"""umst_plugin/patches/bf16_cli_flag.py piece by piece: where fairseq's ``--bf16`` (which its options.py turns into
``--tpu``) is made to mean bf16 on this device, where it is left alone (a TPU asked for, torch_xla installed, no
``--bf16``), and that the CLIs' entry (``distributed_utils.call_main``) records the command line's ``--amp``. The
end-to-end run, ``fairseq-train --bf16`` on a CPU, is tests/test_mixed_precision.py's."""
import importlib.util
import logging

import pytest
from omegaconf import OmegaConf

import umst_plugin  # noqa: F401  (installs the patches)
from umst_plugin import mixed_precision
from umst_plugin.patches import bf16_cli_flag, installed


def config(common, distributed=True):
    groups = {"common": common}
    if distributed:
        groups["distributed_training"] = {"tpu": common.get("tpu", False), "distributed_world_size": 1}
    return OmegaConf.create(groups)


@pytest.mark.parametrize("argv, asked", [
    (["--tpu"], True), (["common.tpu=true"], True), (["++common.tpu=true"], True), (["+common.tpu=true"], True),
    (["--bf16", "--tpus"], False), (["--bf16"], False), ([], False), (["common.tpu_x=1"], False)])
def test_a_tpu_is_asked_for_by_tpu_or_hydras_common_tpu(argv, asked):
    assert bf16_cli_flag._tpu_explicitly_requested(argv) is asked


def test_plain_bf16_turns_off_the_tpu_fairseq_inferred_in_every_group(caplog):
    cfg = config({"bf16": True, "tpu": True, "cpu": True})
    with caplog.at_level(logging.INFO, logger=bf16_cli_flag.__name__):
        assert bf16_cli_flag.plain_bf16_means_bf16(cfg, argv=["--bf16"]) is True
    assert cfg.common.tpu is False and cfg.distributed_training.tpu is False and cfg.common.bf16 is True
    assert "--bf16 without torch_xla: bf16 weights on CPU (fp32 master copy), not a TPU" in caplog.text
    # a config without the distributed group, or whose group has no tpu key, is changed where it can be
    cfg = config({"bf16": True, "tpu": True}, distributed=False)
    assert bf16_cli_flag.plain_bf16_means_bf16(cfg, argv=[]) is True and cfg.common.tpu is False
    cfg = OmegaConf.create({"common": {"bf16": True, "tpu": True}, "distributed_training": {"distributed_world_size": 1}})
    assert bf16_cli_flag.plain_bf16_means_bf16(cfg, argv=[]) is True
    assert "tpu" not in cfg.distributed_training


@pytest.mark.parametrize("cpu, cuda, device", [(True, False, "CPU"), (None, False, "CPU"), (False, False, "CPU"),
                                               (True, True, "CPU"), (None, True, "CUDA"), (False, True, "CUDA")])
def test_the_log_names_the_device_the_bf16_weights_are_on(cpu, cuda, device, monkeypatch, caplog):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    common = {"bf16": True, "tpu": True} if cpu is None else {"bf16": True, "tpu": True, "cpu": cpu}
    with caplog.at_level(logging.INFO, logger=bf16_cli_flag.__name__):
        assert bf16_cli_flag.plain_bf16_means_bf16(config(common), argv=[]) is True
    assert f"bf16 weights on {device} (fp32 master copy)" in caplog.text


@pytest.mark.parametrize("common", [{"bf16": False, "tpu": True}, {"bf16": True, "tpu": False}, {"tpu": True},
                                    {"bf16": True}])
def test_without_both_bf16_and_the_inferred_tpu_nothing_changes(common):
    cfg = config(common)
    before = OmegaConf.to_container(cfg)
    assert bf16_cli_flag.plain_bf16_means_bf16(cfg, argv=[]) is False
    assert OmegaConf.to_container(cfg) == before


def test_a_tpu_asked_for_or_torch_xla_installed_keeps_fairseqs_meaning(monkeypatch):
    cfg = config({"bf16": True, "tpu": True})
    assert bf16_cli_flag.plain_bf16_means_bf16(cfg, argv=["--bf16", "--tpu"]) is False and cfg.common.tpu is True
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "torch_xla" else find_spec(name, *a))
    assert bf16_cli_flag.plain_bf16_means_bf16(cfg, argv=["--bf16"]) is False and cfg.common.tpu is True


def test_the_clis_entry_makes_bf16_plain_and_records_amp_before_main(clean_process_record):
    from fairseq.distributed import utils as distributed_utils

    assert installed(distributed_utils.call_main, bf16_cli_flag.__name__)
    seen = {}

    def main(cfg, **kwargs):
        seen.update(tpu=cfg.common.tpu, amp=mixed_precision._process_amp,
                    dtype=mixed_precision._process_amp_dtype, kwargs=kwargs)

    from umst_dev import dev

    # fairseq's own parser: --bf16 sets --tpu (options.py)
    cfg = dev.config_of(dev.parse_args("transformer", dict(encoder_layers=1, decoder_layers=1, bf16=True, amp=True,
                                                           amp_dtype="bfloat16", cpu=True)))
    assert cfg.common.tpu is True
    distributed_utils.call_main(cfg, main, extra="passed on")
    assert seen == dict(tpu=False, amp=True, dtype="bfloat16", kwargs={"extra": "passed on"})
