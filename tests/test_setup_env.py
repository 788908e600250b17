"""scripts/setup_env.sh: one line per step, pip's output in a log shown only on failure, --cuda planning."""
import os
import subprocess
import sys

import e2e

SETUP = os.path.join(e2e.ROOT, "scripts", "setup_env.sh")


def setup(*args, **environ):
    env = {**os.environ, **environ}
    return subprocess.run(["bash", SETUP, *args], env=env, capture_output=True, text=True, timeout=120)


def test_dry_run_on_a_fresh_machine_plans_every_step_and_touches_nothing(tmp_path):
    venv = tmp_path / "venv"
    proc = setup("--dry-run", VENV=str(venv))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for step in ("creating", "installing torch==2.13.0 (CPU build)", "building fairseq-fixed==0.12.3.1",
                 "installing the plugin", "dry run: nothing changed"):
        assert step in out, out
    assert not venv.exists()


def test_cuda_option_replaces_a_cpu_torch(tmp_path):
    """With --cuda, a venv whose torch has no CUDA (this machine's) gets a CUDA torch planned even when set up."""
    venv = os.path.dirname(os.path.dirname(sys.executable))
    proc = setup("--dry-run", "--cuda", VENV=venv)
    assert proc.returncode == 0, proc.stderr
    assert "installing a CUDA build of torch==2.13.0" in proc.stdout
    assert "--force-reinstall torch==2.13.0" in proc.stdout
    proc = setup("--dry-run", "--cuda", VENV=venv, TORCH_INDEX_URL="https://download.pytorch.org/whl/cu128")
    assert "--index-url https://download.pytorch.org/whl/cu128" in proc.stdout


def test_pip_output_goes_to_the_log_and_is_shown_when_a_step_fails(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)  # pip will fail
    proc = setup(VENV=str(venv))
    assert proc.returncode == 1
    assert "[setup] upgrading pip" in proc.stdout
    assert "FAILED: pip install --upgrade pip" in proc.stderr
    assert "No module named pip" in proc.stderr  # the log's end, shown because the step failed
    assert "No module named pip" in (venv / "setup.log").read_text()
