"""One job's life, as slurmctld and slurmd run it: wait for its dependencies (and its array's throttle), run the
batch script on the job's first node with the SLURM_* environment, signal it before the time limit as
``--signal`` asked, end it at the limit (SIGTERM to the batch step and every job step, SIGKILL after KillWait),
kill what is left of its steps when the script ends, and run it again when it was requeued
(``SLURM_RESTART_COUNT``). sbatch starts one runner per job (per array task), detached.
"""
import os
import signal
import subprocess
import sys
import time

from umst_tools.slurm_shim import options, state

POLL_SECONDS = 0.05


def batch_environment(job):
    """The batch script's environment: the submitting shell's (``--export=ALL``) and Slurm's variables."""
    env = dict(job["environment"])
    env.pop("SLURM_RESTART_COUNT", None)
    nodes = job["nodes"]
    per_node = job["ntasks_per_node"]
    env.update({
        "SLURM_JOB_ID": str(job["job_id"]), "SLURM_JOBID": str(job["job_id"]), "SLURM_JOB_NAME": job["name"],
        "SLURM_JOB_NODELIST": options.compress_hostlist(nodes), "SLURM_NODELIST": options.compress_hostlist(nodes),
        "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_NNODES": str(len(nodes)),
        "SLURM_NTASKS": str(per_node * len(nodes)), "SLURM_NPROCS": str(per_node * len(nodes)),
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{len(nodes)})" if len(nodes) > 1 else str(per_node),
        "SLURM_SUBMIT_DIR": job["submit_dir"], "SLURM_SUBMIT_HOST": job["submit_host"],
        "SLURM_JOB_PARTITION": job["partition"], "SLURM_CLUSTER_NAME": "shim", "SLURM_NODEID": "0",
        "SLURMD_NODENAME": nodes[0], "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "ENVIRONMENT": "BATCH",
        "SLURM_JOB_USER": job["user"], "SLURM_JOB_UID": str(os.getuid()), "SLURM_SHIM_STATE": job["state_dir"],
    })
    if job.get("ntasks_per_node_given"):
        env["SLURM_NTASKS_PER_NODE"] = str(per_node)
    if job.get("cpus_per_task"):
        env["SLURM_CPUS_PER_TASK"] = str(job["cpus_per_task"])
    if job.get("gpus_per_node"):
        env["SLURM_GPUS_ON_NODE"] = str(job["gpus_per_node"])
    if job["restart_count"] > 0:  # Slurm sets it once a job has been restarted
        env["SLURM_RESTART_COUNT"] = str(job["restart_count"])
    if job.get("array_job_id") is not None:
        env.update({"SLURM_ARRAY_JOB_ID": str(job["array_job_id"]), "SLURM_ARRAY_TASK_ID": str(job["array_task_id"]),
                    "SLURM_ARRAY_TASK_COUNT": str(job["array_task_count"]),
                    "SLURM_ARRAY_TASK_MIN": str(job["array_task_min"]),
                    "SLURM_ARRAY_TASK_MAX": str(job["array_task_max"])})
    return env


def _dependencies_met(root, job):
    """True when every dependency is satisfied, False while one may still be, None when one never will be."""
    ready = True
    for kind, dep in job.get("dependency", []):
        jobs = [state.load(root, j) for j in state.resolve(root, dep)]
        if not jobs:
            return None
        if any(j["state"] not in state.TERMINAL_STATES for j in jobs):
            ready = False
            continue
        ok = all(j["state"] == "COMPLETED" for j in jobs)
        if (kind == "afterok" and not ok) or (kind == "afternotok" and ok):
            return None
    return ready


def _throttle_allows(root, job):
    limit = job.get("array_throttle")
    if not limit:
        return True
    running = [j for j in state.all_jobs(root) if j.get("array_job_id") == job["array_job_id"]
               and j["state"] == "RUNNING" and j["job_id"] != job["job_id"]]
    return len(running) < limit


def _open_output(path, append):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return open(path, "ab" if append else "wb")


class _BatchProcess:
    """The batch script's process, reaped with os.wait4: its CPU time, with that of every process it waited for
    (srun and the tasks srun waited for), is what sacct reports as the job's TotalCPU."""

    def __init__(self, popen):
        # (the Popen is kept: a Popen dropped while its child runs is reaped by the next Popen's clean-up)
        self.popen, self.pid, self.returncode, self.cpu_seconds = popen, popen.pid, None, 0.0

    def poll(self):
        if self.returncode is None:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid:
                self.returncode = self.popen.returncode = os.waitstatus_to_exitcode(status)
                self.cpu_seconds = usage.ru_utime + usage.ru_stime
        return self.returncode

    def wait(self):
        while self.poll() is None:
            time.sleep(POLL_SECONDS)
        return self.returncode


def _end(root, job_id, proc, reason):
    """Slurm's job termination: SIGCONT and SIGTERM to the batch step and every job step, SIGKILL to whatever is
    left after KillWait."""
    job = state.load(root, job_id)
    for sig in (signal.SIGCONT, signal.SIGTERM):
        state.signal_batch(job, sig, whole_group=True)
        state.signal_steps(job, sig)
    deadline = time.monotonic() + job["kill_wait"]
    while time.monotonic() < deadline:
        job = state.load(root, job_id)
        alive = proc.poll() is None or any(_group_alive(p) for p in job.get("step_pgids", []))
        if not alive:
            break
        time.sleep(POLL_SECONDS)
    job = state.load(root, job_id)
    state.signal_batch(job, signal.SIGKILL, whole_group=True)
    state.signal_steps(job, signal.SIGKILL)
    proc.wait()
    return reason


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def run_once(root, job_id):
    """Run the batch script once; returns the job's end state and exit code."""
    job = state.load(root, job_id)
    out_path = os.path.join(job["workdir"], options.expand_output_pattern(job["output"], job))
    err_path = os.path.join(job["workdir"], options.expand_output_pattern(job["error"], job)) if job["error"] else None
    append = job["open_mode"] == "append"
    out = _open_output(out_path, append)
    err = _open_output(err_path, append) if err_path and err_path != out_path else None
    proc = _BatchProcess(subprocess.Popen([job["script_copy"], *job["script_args"]], cwd=job["workdir"],
                                          env=batch_environment(job), stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=err or subprocess.STDOUT, start_new_session=True))
    out.close()
    if err:
        err.close()
    start = time.time()
    state.update(root, job_id, state="RUNNING", batch_pid=proc.pid, start_time=start, step_pgids=[],
                 warned=False, reason="None")
    ended = None
    while proc.poll() is None:
        time.sleep(POLL_SECONDS)
        job = state.load(root, job_id)
        if job.get("terminate"):  # scancel, or scontrol requeue of a running job
            ended = _end(root, job_id, proc, job["terminate"])
            break
        limit = job["time_limit"]
        if limit is None:
            continue
        elapsed = time.time() - start
        if job.get("signal") and not job.get("warned") and elapsed >= limit - job["signal"][1]:
            sig, _, batch_only = job["signal"]
            if batch_only:
                state.signal_batch(job, sig)
            else:
                state.signal_steps(job, sig)
            state.update(root, job_id, warned=True)
        if elapsed >= limit:
            ended = _end(root, job_id, proc, "TIMEOUT")
            break
    code = proc.wait()
    code = code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it
    # the batch script is done: Slurm ends the job and every step still running in it
    job = state.load(root, job_id)
    state.signal_steps(job, signal.SIGKILL)
    state.update(root, job_id, cpu_seconds=job.get("cpu_seconds", 0.0) + proc.cpu_seconds)  # over the restarts
    if ended is None:
        ended = "COMPLETED" if code == 0 else "FAILED"
    return ended, code


def run(root, job_id):
    """The runner's main: dependencies, then the script, as many times as it is requeued."""
    while True:
        job = state.load(root, job_id)
        if job["state"] in state.TERMINAL_STATES:
            return
        met = _dependencies_met(root, job)
        if met is None:  # as with kill_invalid_depend: a dependency that can never be met cancels the job
            state.update(root, job_id, state="CANCELLED", reason="DependencyNeverSatisfied", end_time=time.time())
            return
        if job.get("terminate") == "CANCELLED":
            state.update(root, job_id, state="CANCELLED", end_time=time.time())
            return
        if met and _throttle_allows(root, job):
            break
        state.update(root, job_id, reason="Dependency" if not met else "JobArrayTaskLimit")
        time.sleep(0.1)
    while True:
        ended, code = run_once(root, job_id)
        with state.locked(root):
            job = state.load(root, job_id)
            requeue = job.get("requeue_requested") and ended != "CANCELLED"
            if requeue:
                job.update(state="PENDING", reason="BeginTime", restart_count=job["restart_count"] + 1,
                           requeue_requested=False, terminate=None, batch_pid=None, step_pgids=[])
            else:
                job.update(state=ended, exit_code=code, end_time=time.time(), terminate=None, batch_pid=None)
            state.save(root, job)
        if not requeue:
            return


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    root, job_id = argv[0], int(argv[1])
    try:
        run(root, job_id)
    except Exception as e:  # the record says why, instead of a job stuck RUNNING
        state.update(root, job_id, state="FAILED", reason=f"shim runner: {e!r}", exit_code=1, end_time=time.time())
        raise


if __name__ == "__main__":
    main()
