"""The shim's controller state: one JSON record per job in a state directory, read and written under a lock.

``SLURM_SHIM_STATE`` names the directory (default ``$TMPDIR/umst-slurm-shim-<uid>``); every command and every
job runner of one "cluster" shares it. The settings a site puts in slurm.conf come from the environment of
``sbatch``: ``SLURM_SHIM_KILL_WAIT`` (KillWait, seconds between SIGTERM and SIGKILL at a job's end; Slurm's
default 30), ``SLURM_SHIM_JOB_REQUEUE`` (JobRequeue: whether a job without ``--requeue`` may be requeued;
0 here, so a script that wants requeueing must ask), ``SLURM_SHIM_GPUS_PER_NODE`` (the GPUs each node has: 0).
"""
import contextlib
import fcntl
import json
import os
import signal
import tempfile
import time

TERMINAL_STATES = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL")
SHORT_STATES = {"PENDING": "PD", "RUNNING": "R", "COMPLETING": "CG", "COMPLETED": "CD", "FAILED": "F",
                "TIMEOUT": "TO", "CANCELLED": "CA", "REQUEUED": "RQ"}


def state_dir(environ=None):
    environ = os.environ if environ is None else environ
    path = environ.get("SLURM_SHIM_STATE") or os.path.join(tempfile.gettempdir(), f"umst-slurm-shim-{os.getuid()}")
    os.makedirs(os.path.join(path, "jobs"), exist_ok=True)
    return path


@contextlib.contextmanager
def locked(root):
    with open(os.path.join(root, "lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _path(root, job_id):
    return os.path.join(root, "jobs", f"{job_id}.json")


def load(root, job_id):
    with open(_path(root, job_id)) as f:
        return json.load(f)


def save(root, job):
    tmp = _path(root, job["job_id"]) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(job, f, indent=1)
    os.replace(tmp, _path(root, job["job_id"]))


def update(root, job_id, **changes):
    """Change fields of one record under the lock; returns the record as written."""
    with locked(root):
        job = load(root, job_id)
        job.update(changes)
        save(root, job)
        return job


def all_jobs(root):
    out = []
    for name in os.listdir(os.path.join(root, "jobs")):
        if name.endswith(".json"):
            try:
                out.append(load(root, int(name[:-5])))
            except (OSError, ValueError):  # being replaced right now
                continue
    return sorted(out, key=lambda j: j["job_id"])


def new_job_ids(root, count):
    """``count`` consecutive job ids (a job array's tasks each have their own, as in Slurm)."""
    with locked(root):
        counter = os.path.join(root, "next_job_id")
        first = int(open(counter).read()) if os.path.exists(counter) else 1000
        with open(counter, "w") as f:
            f.write(str(first + count))
        return list(range(first, first + count))


def resolve(root, spec):
    """Job ids named by "N" (a job, or every task of the array N), "N_M" (task M of array N)."""
    spec = str(spec).strip()
    base, _, task = spec.partition("_")
    if not base.isdigit() or (task and not task.isdigit()):
        return []
    base = int(base)
    jobs = all_jobs(root)
    if task:
        return [j["job_id"] for j in jobs if j.get("array_job_id") == base and j.get("array_task_id") == int(task)]
    return [j["job_id"] for j in jobs if j["job_id"] == base or j.get("array_job_id") == base]


def signal_group(pgid, sig):
    """Signal a process group that may be gone already."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def signal_steps(job, sig):
    """The signal to every task of the job's running steps (each task is a process group: as slurmstepd signals
    every process of a step's cgroup, the task's children get it too)."""
    for pgid in job.get("step_pgids", []):
        signal_group(pgid, sig)


def signal_batch(job, sig, whole_group=False):
    """The signal to the batch shell (``scancel --batch``, ``--signal=B:``), or to every process of the batch
    step (its process group: the script and what it runs outside srun)."""
    pid = job.get("batch_pid")
    if not pid:
        return
    try:
        if whole_group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_until_done(root, job_ids, poll=0.2, timeout=None):
    """Block until every job is in a terminal state (a requeued job runs again first); returns the records."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        jobs = [load(root, j) for j in job_ids]
        if all(j["state"] in TERMINAL_STATES for j in jobs):
            return jobs
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"jobs {job_ids} not done after {timeout} s: "
                               + ", ".join(f"{j['job_id']} {j['state']}" for j in jobs))
        time.sleep(poll)


SIGNALS_FORWARDED_BY_SRUN = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP,
                             signal.SIGQUIT, signal.SIGALRM, signal.SIGCONT)
