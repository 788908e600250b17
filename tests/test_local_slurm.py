"""umst_tools/local_slurm.py: the real Slurm cluster the WMT rehearsal and the Slurm tests run on -- it starts, a job
runs on it, and stopping it (or killing the process that started it) leaves nothing running; where Slurm cannot
run, one line says why."""
import os
import shutil
import subprocess
import sys
import tempfile
import time


import e2e
import slurm_cluster
from umst_tools import local_slurm


def _started(work, **kwargs):
    slurm_cluster.skip_unless_available()
    local_slurm.start(work, **kwargs)
    return {**os.environ, "SLURM_CONF": os.path.join(work, "slurm.conf")}


def _job_processes(marker):
    """pids of processes whose command line holds ``marker`` (not zombies)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and marker in local_slurm._cmdline(int(entry)) and local_slurm._alive(int(entry)):
            out.append(int(entry))
    return out


def test_stop_ends_the_daemons_and_a_running_job():
    """Two jobs running (one per partition), then stop: no daemon, no slurmstepd, no job process is left."""
    work = tempfile.mkdtemp(prefix="umst-slurm-")
    try:
        env = _started(work)
        marker = f"sleep 600.{os.getpid()}"  # (fractional seconds: a command line no other process has)
        jobs = [subprocess.run(["sbatch", "--parsable", f"--partition={p}", "--output=/dev/null",
                                f"--wrap={marker}"], env=env, capture_output=True, text=True,
                               check=True).stdout.strip() for p in ("normal", "standby")]
        deadline = time.monotonic() + 60
        while len(_job_processes(marker)) < 2:
            assert time.monotonic() < deadline, [slurm_cluster.job_field(env, j, "JobState") for j in jobs]
            time.sleep(0.2)
        before = local_slurm.processes(work)
        assert len(before) >= 7, before  # munged, slurmctld, 2 slurmd, a slurmstepd and a job per job at least
        assert local_slurm.stop(work) == []
        assert local_slurm.processes(work) == [] and _job_processes(marker) == []
        assert not [p for p in before if local_slurm._alive(p)]
    finally:
        local_slurm.stop(work)
        shutil.rmtree(work, ignore_errors=True)


def test_a_caller_killed_outright_still_stops_the_cluster():
    """start --watch PID: SIGKILL to PID (no trap runs) and the watcher stops the cluster by itself."""
    work = tempfile.mkdtemp(prefix="umst-slurm-")
    caller = subprocess.Popen(["sleep", "600"])
    try:
        _started(work, watch=caller.pid)
        assert len(local_slurm.processes(work)) >= 5
        caller.kill()
        caller.wait()
        deadline = time.monotonic() + 30
        while local_slurm.processes(work):
            assert time.monotonic() < deadline, [local_slurm._cmdline(p) for p in local_slurm.processes(work)]
            time.sleep(0.2)
        with open(os.path.join(work, "log", "watcher.log")) as f:
            assert "is gone; cluster stopped" in f.read()
    finally:
        caller.kill()
        local_slurm.stop(work)
        shutil.rmtree(work, ignore_errors=True)


def test_where_slurm_cannot_run_one_line_says_why(tmp_path):
    """No Slurm on PATH (nor in sbin): `check` and the rehearsal exit 3 with one line naming what is missing and
    how to install it; not root: `check` says so."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    os.symlink(os.path.realpath(sys.executable), bin_dir / "python3")  # (the interpreter itself, not a venv's link)
    code = ("import sys; from umst_tools import local_slurm; local_slurm.SBIN = (); "
            "sys.exit(local_slurm.main(['check']))")
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": str(bin_dir), "PYTHONPATH": e2e.ROOT}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=e2e.ROOT, capture_output=True, text=True)
    assert proc.returncode == local_slurm.UNAVAILABLE, proc.stderr
    line, = proc.stdout.splitlines()
    assert line.startswith("Slurm is not installed here (no slurmctld") and "apt-get install slurm-wlm munge" in line
    # the rehearsal (its check runs with the caller's PATH; the daemons in sbin do not make Slurm's clients)
    proc = subprocess.run(["bash", os.path.join(e2e.ROOT, "scripts", "rehearse-wmt.sh")], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True)
    assert proc.returncode == local_slurm.UNAVAILABLE, proc.stderr
    line, = proc.stderr.splitlines()
    assert line.startswith("rehearse-wmt: Slurm cannot run here: Slurm is not installed here (no ") \
        and "sbatch" in line, line
    # not root: as nobody, with a Python nobody may run (the system's; a venv under /root is not readable)
    system_python = "/usr/bin/python3"
    if os.geteuid() == 0 and shutil.which("runuser") and not local_slurm._missing() and \
            subprocess.run(["runuser", "-u", "nobody", "--", system_python, "-c", "pass"]).returncode == 0:
        proc = subprocess.run(["runuser", "-u", "nobody", "--", system_python, "-m", "umst_tools.local_slurm", "check"],
                              cwd=e2e.ROOT, env={"PATH": os.environ["PATH"], "PYTHONPATH": e2e.ROOT},
                              capture_output=True, text=True)
        assert proc.returncode == local_slurm.UNAVAILABLE, proc.stderr
        assert proc.stdout.startswith("not root:"), proc.stdout


def test_two_clusters_run_side_by_side():
    """Ports, ClusterName, munge socket and key of their own: a job of each runs while both are up."""
    works = [tempfile.mkdtemp(prefix="umst-slurm-") for _ in range(2)]
    try:
        envs = [_started(w) for w in works]
        for env in envs:
            proc = subprocess.run(["srun", "--nodes=2", "--ntasks-per-node=1", "bash", "-c",
                                   "echo $SLURMD_NODENAME $SLURM_CLUSTER_NAME"], env=env, capture_output=True,
                                  text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
            assert sorted(line.split()[0] for line in proc.stdout.splitlines()) == ["n1", "n2"], proc.stdout
        names = {open(os.path.join(w, "slurm.conf")).read().split("ClusterName=")[1].split()[0] for w in works}
        assert len(names) == 2
    finally:
        for w in works:
            assert local_slurm.stop(w) == []
            shutil.rmtree(w, ignore_errors=True)


def test_the_config_is_what_the_docs_say():
    """The settings the rehearsal relies on and docs/tests-and-benchmarks.md names."""
    conf = local_slurm.slurm_conf("/w", "host", [1, 2, 3], 2)
    for line in ("TaskPlugin=task/affinity", "TaskPluginParam=Cores", "PreemptType=preempt/partition_prio",
                 "PreemptMode=REQUEUE", "AuthInfo=socket=/w/munge/munge.socket,cred_expire=5", "MinJobAge=16",
                 "SchedulerParameters=sched_interval=2,bf_interval=2",
                 "PartitionName=standby Nodes=n1,n2 MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE"):
        assert line in conf.splitlines(), line
    assert "NodeName=n1 NodeHostname=host NodeAddr=127.0.0.1 Port=2 CPUs=2" in conf


def test_the_daemons_ports_are_free_and_outside_the_ephemeral_range():
    """The ports written into slurm.conf: free when drawn, distinct, and never ones the kernel hands out for
    outgoing connections (a port tested free by binding to port 0 is one: a connection made before the daemon
    binds it may take it). A port another program holds is passed over."""
    import random
    import socket

    low, high = local_slurm._ephemeral_range()
    ports = local_slurm._free_ports(3)
    assert len(set(ports)) == 3 and all(not low <= p <= high for p in ports), (ports, low, high)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    held = socket.socket()
    held.bind(("127.0.0.1", ports[0]))
    held.listen()
    try:
        class HeldFirst:  # draws the held port first, then others
            def sample(self, population, k):
                return [ports[0]] + random.Random(0).sample([q for q in population if q != ports[0]], k - 1)
        drawn = local_slurm._free_ports(2, rng=HeldFirst())
        assert ports[0] not in drawn and len(drawn) == 2, drawn
    finally:
        held.close()
