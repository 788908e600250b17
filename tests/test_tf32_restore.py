"""--tf32 in fairseq-validate, -generate and -interactive (umst_plugin/compilation/flags.py): on while the CLI's
main runs, and torch's settings as they were once it returns (the setting is process-wide). torch's defaults:
matmul.allow_tf32 False, cudnn.allow_tf32 True."""
import pytest
import torch
from omegaconf import OmegaConf

import umst_plugin  # noqa: F401  (installs the patches)
from umst_plugin.compilation import flags as compile_flags


@pytest.mark.parametrize("main", ["validate", "generate", "interactive"])
def test_tf32_is_restored_after_the_cli_main(monkeypatch, main):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # an Ampere GPU, faked: set_tf32 switches it on
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100 (faked)")
    seen = []
    # the CLI's own main (what the wrapper wraps), replaced by a probe of what it would run under
    wrapper = {"validate": compile_flags.validate_main, "generate": compile_flags.generate_main,
               "interactive": compile_flags.interactive_main}[main]
    monkeypatch.setattr(wrapper, "__wrapped__", lambda *args: seen.append(
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)))
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, False
        cfg = OmegaConf.create({"common": {"compile": False, "tf32": True, "cpu": False}})
        {"validate": lambda: compile_flags.validate_main(cfg), "generate": lambda: compile_flags.generate_main(cfg, None),
         "interactive": lambda: compile_flags.interactive_main(cfg)}[main]()
        assert seen == [(True, True)]
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before

