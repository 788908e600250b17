"""scripts/setup_env.sh: one line per step, pip's output in a log shown only on failure, --cuda planning."""
import os
import subprocess
import sys

import pytest
import torch

import e2e

SETUP = os.path.join(e2e.ROOT, "scripts", "setup_env.sh")


def setup(*args, **environ):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_VERSION"}  # (the script's default, 2.13.0)
    env.update(environ)
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
    if torch.version.cuda is not None:
        pytest.skip(f"this venv's torch ({torch.__version__}) is a CUDA build: --cuda keeps it")
    venv = os.path.dirname(os.path.dirname(sys.executable))
    proc = setup("--dry-run", "--cuda", VENV=venv)
    assert proc.returncode == 0, proc.stderr
    assert "installing a CUDA build of torch==2.13.0" in proc.stdout
    assert "--force-reinstall torch==2.13.0" in proc.stdout
    proc = setup("--dry-run", "--cuda", VENV=venv, TORCH_INDEX_URL="https://download.pytorch.org/whl/cu128")
    assert "--index-url https://download.pytorch.org/whl/cu128" in proc.stdout


def test_a_venv_cut_short_gets_pip_and_a_failing_step_shows_the_log(tmp_path):
    """A venv whose creation was cut short (its python there, pip not yet) gets pip from ensurepip, where every pip
    step had failed with "No module named pip" until the venv was removed by hand. Then a step that fails (torch
    from no index) shows the end of pip's log, which has pip's own output."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    proc = setup("--no-slurm", VENV=str(venv), PIP_NO_INDEX="1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "has no pip (its creation was cut short?): adding it with ensurepip" in proc.stdout, proc.stdout
    assert "[setup] upgrading pip" in proc.stdout and "[setup] installing torch==2.13.0" in proc.stdout, proc.stdout
    assert "No module named pip" not in proc.stderr, proc.stderr
    assert "FAILED: pip install torch==2.13.0" in proc.stderr, proc.stderr
    # the log's end, shown on failure: pip's own error (for torch, or one of its needs where a wheel cache has torch)
    assert "ERROR: No matching distribution found for " in proc.stderr, proc.stderr
    assert "ERROR: No matching distribution found for " in (venv / "setup.log").read_text()
    assert subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"]).returncode == 0


def test_torch_version_picks_the_torch(tmp_path):
    proc = setup("--dry-run", VENV=str(tmp_path / "venv"), TORCH_VERSION="2.11.0")
    assert proc.returncode == 0, proc.stderr
    assert "installing torch==2.11.0\n" in proc.stdout and "pip install torch==2.11.0" in proc.stdout, proc.stdout


def test_slurm_is_one_line_and_no_slurm_skips_it(tmp_path):
    """The Slurm step (for the WMT rehearsal's local cluster) prints one line whatever the machine -- present,
    would install (root with apt-get), or not installable (then the Slurm tests skip) -- and --no-slurm drops it;
    --dry-run with --cuda plans the CUDA torch only (not the CPU build as well)."""
    proc = setup("--dry-run", "--cuda", VENV=str(tmp_path / "venv"))
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "Slurm" in line]
    assert len(lines) == 1 and lines[0].startswith("[setup] ") and any(
        what in lines[0] for what in ("Slurm present (slurm", "would install Slurm", "not installable here")), lines
    assert "installing a CUDA build of torch" in proc.stdout and "(CPU build)" not in proc.stdout, proc.stdout
    proc = setup("--dry-run", "--no-slurm", VENV=str(tmp_path / "venv"))
    assert proc.returncode == 0 and "Slurm" not in proc.stdout, proc.stdout
