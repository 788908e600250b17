"""A real Slurm cluster for a test: umst_tools/local_slurm.py's two nodes on this machine, started in a directory of
its own and stopped afterwards, with nothing of it left running. Skips (with the reason in one line) where Slurm
cannot run: not installed, not root."""
import contextlib
import os
import shutil
import subprocess
import tempfile

import pytest

from umst_tools import local_slurm


def skip_unless_available():
    why = local_slurm.unavailable()
    if why:
        pytest.skip(f"Slurm cannot run here: {why}")


@contextlib.contextmanager
def cluster():
    """Yields the environment of the cluster's clients (this process's, with SLURM_CONF). A short directory of
    its own: munged's socket path must stay under the Unix limit."""
    skip_unless_available()
    work = tempfile.mkdtemp(prefix="umst-slurm-")
    try:
        local_slurm.start(work)
        yield {**os.environ, "SLURM_CONF": os.path.join(work, "slurm.conf")}
    finally:
        left = local_slurm.stop(work)
        assert not left, f"processes of the cluster in {work} still alive after stop: {left}"
        shutil.rmtree(work, ignore_errors=True)


def job_field(env, job, name):
    out = subprocess.run(["scontrol", "show", "job", "-o", str(job)], env=env, capture_output=True, text=True)
    for word in out.stdout.split():
        key, _, value = word.partition("=")
        if key == name:
            return value
    return None
