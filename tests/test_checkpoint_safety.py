import subprocess
import sys

import e2e


def test_checkpoint_loads_with_weights_only_after_plugin_import(toy_databin, tmp_path):
    """A real fairseq-train checkpoint loads under weights_only=True once
    the plugin is imported, and not before: the allow-list is exactly what is needed."""
    e2e.train(toy_databin, str(tmp_path), "transformer", *e2e.TINY, max_update=3)
    ckpt = str(tmp_path / "checkpoint_last.pt")
    code = ("import sys, torch\n"
            "try:\n    torch.load(sys.argv[1], weights_only=True); print('loaded-before')\n"
            "except Exception as e:\n    print('refused-before')\n"
            "import umst_plugin\n"
            "state = torch.load(sys.argv[1], weights_only=True)\n"
            "print('loaded-after', sorted(state))\n")
    out = subprocess.run([sys.executable, "-c", code, ckpt], capture_output=True, text=True, env=e2e.cli_env(),
                         cwd=e2e.ROOT, check=True).stdout
    assert "refused-before" in out and "loaded-after" in out, out
