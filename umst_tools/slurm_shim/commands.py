"""sbatch, srun, scontrol, squeue and scancel of the shim: each ``main_<command>(argv)`` returns the exit status.

Only what the project's scripts and a user rehearsing them use is there; an option the shim does not know stops
the command with Slurm's own message, so that nothing is silently ignored.
"""
import getpass
import os
import signal
import socket
import subprocess
import sys
import time

from umst_tools.slurm_shim import options, state
from umst_tools.slurm_shim.options import SlurmOptionError

SHIM_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _node_names(count):
    # Loopback addresses as host names: every "node" resolves to this machine, so a rendezvous at the job's first
    # node (tcp://127.0.0.1:PORT) works as it does on a cluster.
    return [f"127.0.0.{i + 1}" for i in range(count)]


def _int_option(opts, name, default):
    value = opts.get(name)
    if value is None:
        return default
    try:
        return int(str(value).split("-")[0])
    except ValueError:
        raise SlurmOptionError(f"Invalid --{name} argument: {value!r}") from None


def _gpus_requested(opts):
    if "gpus-per-node" in opts:
        return int(str(opts["gpus-per-node"]).split(":")[-1])
    gres = opts.get("gres")
    if not gres or gres == "none":
        return 0
    for item in gres.split(","):
        parts = item.split(":")
        if parts[0] == "gpu":
            return int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return 0


# ---- sbatch -----------------------------------------------------------------------------------------------------------

def main_sbatch(argv):
    cli, rest = options.parse_options(argv, options.SBATCH_OPTIONS, "sbatch")
    if not rest:
        raise SlurmOptionError("sbatch: the shim needs a batch script file (no script on stdin)")
    script, script_args = rest[0], rest[1:]
    try:
        with open(script) as f:
            text = f.read()
    except OSError as e:
        raise SlurmOptionError(f"sbatch: error: Unable to open file {script}: {e.strerror}") from None
    if not text.startswith("#!"):
        raise SlurmOptionError("sbatch: error: This does not look like a batch script.  The first line must start "
                               "with #! followed by the path to an interpreter.")
    directives, stray = options.parse_options(options.script_directives(text), options.SBATCH_OPTIONS,
                                          f"sbatch ({script}, #SBATCH)", stop_at_positional=False)
    if stray:
        raise SlurmOptionError(f"sbatch: error: {script}: #SBATCH line with a non-option {stray[0]!r}")
    opts = {**directives, **cli}  # the command line wins over the script's directives
    if "no-requeue" in cli:
        opts.pop("requeue", None)
    if "requeue" in cli:
        opts.pop("no-requeue", None)
    root = state.state_dir()

    nodes = _int_option(opts, "nodes", 1)
    per_node = _int_option(opts, "ntasks-per-node", 0)
    if not per_node:
        per_node = -(-_int_option(opts, "ntasks", nodes) // nodes)
    gpus = _gpus_requested(opts)
    available = int(os.environ.get("SLURM_SHIM_GPUS_PER_NODE", "0"))
    if gpus > available:
        raise SlurmOptionError(f"sbatch: error: Batch job submission failed: Requested node configuration is not "
                               f"available ({gpus} GPUs per node asked, the shim's nodes have {available}: "
                               f"--gres=none or set SLURM_SHIM_GPUS_PER_NODE)")
    time_limit = options.parse_time(opts["time"]) if "time" in opts else None
    sig = options.parse_signal_option(opts["signal"]) if "signal" in opts else None
    requeue_default = os.environ.get("SLURM_SHIM_JOB_REQUEUE", "0") == "1"
    requeueable = bool(opts.get("requeue")) or (requeue_default and "no-requeue" not in opts)
    if opts.get("open-mode", "truncate") not in ("append", "truncate"):
        raise SlurmOptionError(f"sbatch: error: Invalid --open-mode argument: {opts['open-mode']!r}")
    if opts.get("export", "ALL") != "ALL":
        raise SlurmOptionError("sbatch: the shim runs jobs with --export=ALL only")
    array_ids, throttle = options.parse_array(opts["array"]) if "array" in opts else ([None], None)
    dependency = options.parse_dependency(opts["dependency"]) if "dependency" in opts else []
    name = opts.get("job-name") or os.path.basename(script)
    submit_dir = os.getcwd()
    workdir = os.path.abspath(opts.get("chdir", submit_dir))
    default_output = "slurm-%A_%a.out" if "array" in opts else "slurm-%j.out"

    ids = state.new_job_ids(root, len(array_ids))
    spool = os.path.join(root, "spool")
    os.makedirs(spool, exist_ok=True)
    copy = os.path.join(spool, f"job{ids[0]}.script")  # slurmd runs a copy: later edits of the file do not count
    with open(copy, "w") as f:
        f.write(text)
    os.chmod(copy, 0o755)
    base = {
        "name": name, "nodes": _node_names(nodes), "ntasks_per_node": per_node,
        "ntasks_per_node_given": "ntasks-per-node" in opts, "cpus_per_task": _int_option(opts, "cpus-per-task", 0),
        "gpus_per_node": gpus, "time_limit": time_limit, "signal": sig, "requeueable": requeueable,
        "open_mode": opts.get("open-mode", "truncate"), "output": opts.get("output", default_output),
        "error": opts.get("error"), "dependency": dependency, "partition": opts.get("partition", "shim"),
        "script": os.path.abspath(script), "script_copy": copy, "script_args": script_args,
        "environment": dict(os.environ), "submit_dir": submit_dir, "workdir": workdir,
        "submit_host": socket.gethostname(), "user": getpass.getuser(), "state_dir": root,
        "kill_wait": float(os.environ.get("SLURM_SHIM_KILL_WAIT", "30")), "restart_count": 0, "state": "PENDING",
        "reason": "None", "submit_time": time.time(), "array_throttle": throttle, "step_pgids": [],
    }
    for job_id, task in zip(ids, array_ids):
        job = {**base, "job_id": job_id}
        if task is not None:
            job.update(array_job_id=ids[0], array_task_id=task, array_task_count=len(array_ids),
                       array_task_min=array_ids[0], array_task_max=array_ids[-1])
        with state.locked(root):
            state.save(root, job)
    for job_id in ids:
        _start_runner(root, job_id)
    print(ids[0] if opts.get("parsable") else f"Submitted batch job {ids[0]}", flush=True)
    if not opts.get("wait"):
        return 0
    jobs = state.wait_until_done(root, ids)
    return max(j.get("exit_code") or (0 if j["state"] == "COMPLETED" else 1) for j in jobs)


# ---- srun (inside a job) ---------------------------------------------------------------------------------------------

def main_srun(argv):
    opts, command = options.parse_options(argv, options.SRUN_OPTIONS, "srun")
    if not command:
        raise SlurmOptionError("srun: fatal: No command given to execute.")
    if "SLURM_JOB_ID" not in os.environ:
        raise SlurmOptionError("srun: the shim runs srun inside a job only (sbatch a script that calls it)")
    if opts.get("label"):
        raise SlurmOptionError("srun: the shim does not label output (--label)")
    root = state.state_dir()
    job_id = int(os.environ["SLURM_JOB_ID"])
    job = state.load(root, job_id)
    nodes = job["nodes"][:_int_option(opts, "nodes", len(job["nodes"]))]
    if len(nodes) < _int_option(opts, "nodes", 0):
        raise SlurmOptionError(f"srun: error: Only allocated {len(job['nodes'])} nodes asked for "
                               f"{opts['nodes']}")
    per_node = _int_option(opts, "ntasks-per-node", 0)
    ntasks = _int_option(opts, "ntasks", 0) or (per_node or job["ntasks_per_node"]) * len(nodes)
    per_node = per_node or -(-ntasks // len(nodes))
    kill_on_bad_exit = opts.get("kill-on-bad-exit") not in (None, "0")
    with state.locked(root):
        job = state.load(root, job_id)
        step = job.get("next_step", 0)
        job["next_step"] = step + 1
        state.save(root, job)

    step_nodes = options.compress_hostlist(nodes)
    tasks = []
    for rank in range(ntasks):
        node = rank // per_node
        env = dict(os.environ)
        env.update({"SLURM_STEP_ID": str(step), "SLURM_STEPID": str(step), "SLURM_PROCID": str(rank),
                    "SLURM_LOCALID": str(rank % per_node), "SLURM_NODEID": str(node), "SLURMD_NODENAME": nodes[node],
                    "SLURM_STEP_NODELIST": step_nodes, "SLURM_NODELIST": step_nodes,
                    "SLURM_STEP_NUM_NODES": str(len(nodes)), "SLURM_NNODES": str(len(nodes)),
                    "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks),
                    "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{len(nodes)})" if len(nodes) > 1 else str(per_node)})
        # each task in a process group of its own, as each node's slurmstepd holds its tasks in a cgroup
        tasks.append(subprocess.Popen(command, env=env, cwd=opts.get("chdir"), start_new_session=True))
    pgids = [t.pid for t in tasks]
    with state.locked(root):
        job = state.load(root, job_id)
        job["step_pgids"] = job.get("step_pgids", []) + pgids
        state.save(root, job)

    def forward(signum, frame):  # srun passes the signals it gets on to every task
        for pgid in pgids:
            state.signal_group(pgid, signum)

    for sig in state.SIGNALS_FORWARDED_BY_SRUN:
        signal.signal(sig, forward)
    codes, first_failure = {}, None
    try:
        while len(codes) < len(tasks):
            for i, t in enumerate(tasks):
                if i in codes or t.poll() is None:
                    continue
                codes[i] = t.returncode if t.returncode >= 0 else 128 - t.returncode
                if codes[i] != 0 and first_failure is None:
                    first_failure = codes[i]
                    if kill_on_bad_exit:
                        print(f"srun: error: task {i}: Exited with exit code {codes[i]}; terminating the step "
                              "(--kill-on-bad-exit)", file=sys.stderr, flush=True)
                        for pgid in pgids:
                            state.signal_group(pgid, signal.SIGKILL)
            time.sleep(0.02)
    finally:
        with state.locked(root):
            job = state.load(root, job_id)
            job["step_pgids"] = [p for p in job.get("step_pgids", []) if p not in pgids]
            state.save(root, job)
    for i, code in sorted(codes.items()):
        if code:
            print(f"srun: error: {nodes[i // per_node]}: task {i}: Exited with exit code {code}", file=sys.stderr)
    # the highest task exit status; with --kill-on-bad-exit the failure that ended the step (not the kills)
    return first_failure if kill_on_bad_exit and first_failure is not None else max(codes.values())


# ---- scontrol ----------------------------------------------------------------------------------------------------------

def _show_job(job):
    runtime = (job.get("end_time") or time.time()) - job["start_time"] if job.get("start_time") else 0
    fields = [("JobId", job["job_id"]), ("JobName", job["name"]),
              ("ArrayJobId", job.get("array_job_id")), ("ArrayTaskId", job.get("array_task_id")),
              ("JobState", job["state"]), ("Reason", job.get("reason", "None")),
              ("Requeue", int(job["requeueable"])), ("Restarts", job["restart_count"]),
              ("ExitCode", f"{job.get('exit_code') or 0}:0"), ("RunTime", options.format_time(runtime)),
              ("TimeLimit", options.format_time(job["time_limit"])),
              ("TotalCPU", f"{job.get('cpu_seconds', 0.0):.1f}"),  # sacct's field: the job's processes, in seconds
              ("NumNodes", len(job["nodes"])),
              ("NodeList", options.compress_hostlist(job["nodes"])), ("WorkDir", job["workdir"]),
              ("StdOut", os.path.join(job["workdir"], options.expand_output_pattern(job["output"], job)))]
    return " ".join(f"{k}={v}" for k, v in fields if v is not None)


def main_scontrol(argv):
    root = state.state_dir()
    if argv[:2] == ["show", "hostnames"] or argv[:2] == ["show", "hostname"]:
        text = argv[2] if len(argv) > 2 else os.environ.get("SLURM_JOB_NODELIST", "")
        for name in options.expand_hostlist(text):
            print(name)
        return 0
    if argv[:2] == ["show", "hostlist"] and len(argv) > 2:
        print(options.compress_hostlist(argv[2].split(",")))
        return 0
    if argv[:2] == ["show", "job"]:
        ids = state.resolve(root, argv[2]) if len(argv) > 2 else [j["job_id"] for j in state.all_jobs(root)]
        if len(argv) > 2 and not ids:
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
            return 1
        for job_id in ids:
            print(_show_job(state.load(root, job_id)))
        return 0
    if argv[:1] == ["requeue"] and len(argv) > 1:
        status = 0
        for spec in argv[1].split(","):
            for job_id in state.resolve(root, spec) or [None]:
                if job_id is None:
                    print(f"Requeue of job {spec} failed: Invalid job id specified", file=sys.stderr)
                    status = 1
                    continue
                with state.locked(root):
                    job = state.load(root, job_id)
                    if not job["requeueable"]:
                        print(f"Requeue of job {job_id} failed: Requested operation is presently disabled "
                              "(the job was not submitted with --requeue)", file=sys.stderr)
                        status = 1
                        continue
                    if job["state"] in ("RUNNING", "PENDING"):  # a running job ends now and runs again
                        job.update(requeue_requested=True, terminate="REQUEUED" if job["state"] == "RUNNING" else None)
                    state.save(root, job)
                if job["state"] in state.TERMINAL_STATES:  # a finished job: back to pending, a runner again
                    state.update(root, job_id, state="PENDING", restart_count=job["restart_count"] + 1,
                                 reason="BeginTime", exit_code=None)
                    _start_runner(root, job_id)
        return status
    if argv[:1] == ["update"]:
        fields = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
        fields = {k.lower(): v for k, v in fields.items()}
        if "jobid" not in fields or set(fields) - {"jobid", "timelimit"}:
            raise SlurmOptionError("scontrol: the shim updates JobId=N TimeLimit=T only")
        for job_id in state.resolve(root, fields["jobid"]):
            state.update(root, job_id, time_limit=options.parse_time(fields["timelimit"]))
        return 0
    raise SlurmOptionError(f"scontrol: the shim does not know {' '.join(argv)!r} (show hostnames|hostlist|job, "
                           "requeue, update JobId= TimeLimit=)")


def _start_runner(root, job_id):
    log = open(os.path.join(root, f"runner-{job_id}.log"), "ab")
    subprocess.Popen([sys.executable, "-m", "umst_tools.slurm_shim.runner", root, str(job_id)],
                     env={**os.environ, "PYTHONPATH": SHIM_ROOT}, cwd=root, stdin=subprocess.DEVNULL,
                     stdout=log, stderr=log, start_new_session=True, close_fds=True)
    log.close()


# ---- squeue ----------------------------------------------------------------------------------------------------------------

SQUEUE_OPTIONS = {"jobs": ("j", True), "noheader": ("h", False), "user": ("u", True), "me": (None, False),
                  "states": ("t", True), "format": ("o", True), "name": ("n", True), "all": ("a", False)}


def main_squeue(argv):
    opts, rest = options.parse_options(argv, SQUEUE_OPTIONS, "squeue")
    if rest:
        raise SlurmOptionError(f"squeue: unexpected arguments {rest}")
    root = state.state_dir()
    jobs = state.all_jobs(root)
    if "jobs" in opts:
        wanted = {j for spec in opts["jobs"].split(",") for j in state.resolve(root, spec)}
        jobs = [j for j in jobs if j["job_id"] in wanted]
    if "name" in opts:
        jobs = [j for j in jobs if j["name"] in opts["name"].split(",")]
    states = opts.get("states", "PENDING,RUNNING").upper().split(",")
    if "ALL" not in states:
        jobs = [j for j in jobs if j["state"] in states or state.SHORT_STATES.get(j["state"]) in states]
    fmt = opts.get("format", "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R")

    def field(job, code):
        running = time.time() - job["start_time"] if job.get("start_time") and job["state"] == "RUNNING" else 0
        jid = (f"{job['array_job_id']}_{job['array_task_id']}" if job.get("array_job_id") is not None
               else str(job["job_id"]))
        return {"i": jid, "A": str(job.get("array_job_id") or job["job_id"]),
                "a": str(job.get("array_task_id", "N/A")), "P": job["partition"], "j": job["name"],
                "u": job["user"], "t": state.SHORT_STATES.get(job["state"], job["state"][:2]), "T": job["state"],
                "M": options.format_time(running), "l": options.format_time(job["time_limit"]),
                "D": str(len(job["nodes"])), "N": options.compress_hostlist(job["nodes"]),
                "r": job.get("reason", "None"),
                "R": options.compress_hostlist(job["nodes"]) if job["state"] == "RUNNING"
                else f"({job.get('reason', 'None')})"}[code]

    headers = {"i": "JOBID", "A": "ARRAY_JOB_ID", "a": "ARRAY_TASK_ID", "P": "PARTITION", "j": "NAME", "u": "USER",
               "t": "ST", "T": "STATE", "M": "TIME", "l": "TIME_LIMIT", "D": "NODES", "N": "NODELIST", "r": "REASON",
               "R": "NODELIST(REASON)"}
    import re

    def render(values):
        def one(m):
            right, width, code = m.group(1) == ".", m.group(2), m.group(3)
            value = values(code)
            if width:
                value = value.rjust(int(width)) if right else value.ljust(int(width))
            return value
        return re.sub(r"%(\.?)(\d*)([iAaPjutTMlDNrR])", one, fmt)

    if not opts.get("noheader"):
        print(render(lambda c: headers[c]))
    for job in jobs:
        print(render(lambda c: field(job, c)))
    return 0


# ---- scancel ----------------------------------------------------------------------------------------------------------------

SCANCEL_OPTIONS = {"signal": ("s", True), "batch": ("b", False), "full": ("f", False), "quiet": ("Q", False),
                   "name": ("n", True)}


def main_scancel(argv):
    opts, specs = options.parse_options(argv, SCANCEL_OPTIONS, "scancel", stop_at_positional=False)
    root = state.state_dir()
    ids = [j for spec in specs for j in state.resolve(root, spec)]
    if "name" in opts:
        ids += [j["job_id"] for j in state.all_jobs(root) if j["name"] == opts["name"]]
    if not ids:
        if not opts.get("quiet"):
            print(f"scancel: error: Kill job error on job id {' '.join(specs)}: Invalid job id specified",
                  file=sys.stderr)
        return 1
    for job_id in ids:
        job = state.load(root, job_id)
        if job["state"] in state.TERMINAL_STATES:
            continue
        if "signal" in opts:  # a signal only; the job runs on
            sig = options.parse_signal_name(opts["signal"])
            if opts.get("batch") or opts.get("full"):
                state.signal_batch(job, sig, whole_group=bool(opts.get("full")))
            if not opts.get("batch"):
                state.signal_steps(job, sig)
            continue
        state.update(root, job_id, terminate="CANCELLED", requeue_requested=False)
    return 0


COMMANDS = {"sbatch": main_sbatch, "srun": main_srun, "scontrol": main_scontrol, "squeue": main_squeue,
            "scancel": main_scancel}


def main(command, argv):
    """The entry point of the executables in bin/: Slurm's messages on stderr and exit status 1 on bad input."""
    try:
        return COMMANDS[command](list(argv))
    except SlurmOptionError as e:
        print(str(e), file=sys.stderr)
        return 1
