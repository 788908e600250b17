"""torch's cuDNN attention backend is switched off when the plugin is imported (umst_plugin/patches/cudnn_attention.py:
its backward failed, or gave wrong gradients, for bf16 attention with padding masks on an H100), unless
``UMST_CUDNN_ATTENTION=1`` keeps it on; a torch without the switch is left alone. The flag itself exists on a CPU
build of torch, so the switch is checked here; what the backend does on a GPU: ``python -m umst_dev.find_nonfinite``."""
import torch

import e2e
import umst_plugin  # noqa: F401  (installs the patches)
from umst_plugin.patches import cudnn_attention

PROBE = "import torch, umst_plugin; print(torch.backends.cuda.cudnn_sdp_enabled())"


def test_importing_the_plugin_switches_cudnn_attention_off_unless_asked_to_keep_it(monkeypatch):
    monkeypatch.delenv("UMST_CUDNN_ATTENTION", raising=False)
    assert e2e.fresh_python("import torch; print(torch.backends.cuda.cudnn_sdp_enabled())") == "True"  # torch's
    assert e2e.fresh_python(PROBE) == "False"
    monkeypatch.setenv("UMST_CUDNN_ATTENTION", "1")  # cli_env() passes the environment on
    assert e2e.fresh_python(PROBE) == "True"


def test_the_switch_is_asked_only_where_torch_has_it_and_the_variable_does_not_keep_it(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", calls.append)
    for value, want in ((None, [False]), ("0", [False]), ("1", [])):
        calls.clear()
        if value is None:
            monkeypatch.delenv("UMST_CUDNN_ATTENTION", raising=False)
        else:
            monkeypatch.setenv("UMST_CUDNN_ATTENTION", value)
        cudnn_attention.install()
        assert calls == want, value
    monkeypatch.delattr(torch.backends.cuda, "enable_cudnn_sdp")
    monkeypatch.delenv("UMST_CUDNN_ATTENTION", raising=False)
    cudnn_attention.install()  # a torch without the switch: nothing to do, no error
