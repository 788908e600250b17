"""The Slurm shim (umst_tools/slurm_shim) behaves as Slurm does where the project's scripts and the rehearsal
depend on it: option syntax, the SLURM_* variables, srun's tasks, the time limit's signals in order, requeue,
arrays, dependencies. Small bash jobs, a few seconds in all (the jobs of a test run at the same time)."""
import os
import subprocess
import textwrap
import time

import pytest

from umst_tools import slurm_shim
from umst_tools.slurm_shim import options


# ---- option syntax ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,seconds", [("30", 1800), ("0:40", 40), ("1:02:03", 3723), ("2-0", 172800),
                                          ("1-1:01", 90060), ("1-0:0:5", 86405), ("UNLIMITED", None)])
def test_time_limit_formats(text, seconds):
    assert options.parse_time(text) == seconds


def test_signal_array_dependency_and_hostlist_syntax():
    assert options.parse_signal_option("B:USR1@180") == (10, 180, True)
    assert options.parse_signal_option("SIGTERM") == (15, 60, False)
    assert options.parse_array("1-7:3,10%2") == ([1, 4, 7, 10], 2)
    assert options.parse_dependency("afterok:12:13,afterany:14") == [("afterok", 12), ("afterok", 13),
                                                                      ("afterany", 14)]
    assert options.expand_hostlist("n[01-03,7],gpu-a") == ["n01", "n02", "n03", "n7", "gpu-a"]
    assert options.compress_hostlist(["127.0.0.1", "127.0.0.2"]) == "127.0.0.[1-2]"
    assert options.expand_hostlist(options.compress_hostlist(["127.0.0.1", "127.0.0.2"])) == ["127.0.0.1",
                                                                                              "127.0.0.2"]
    for bad in (lambda: options.parse_time("1:2:3:4"), lambda: options.parse_array("3-1"),
                lambda: options.parse_signal_option("B:NOPE@3"), lambda: options.parse_dependency("after:1")):
        with pytest.raises(options.SlurmOptionError):
            bad()


def test_directives_stop_at_the_first_command_and_the_command_line_wins():
    text = "#!/bin/bash\n#SBATCH --nodes=2 # two\n#SBATCH -J script\n\n#SBATCH --time=5\necho hi\n#SBATCH --nodes=9\n"
    assert options.script_directives(text) == ["--nodes=2", "-J", "script", "--time=5"]
    parsed, rest = options.parse_options(["-J", "cli", "--time", "1", "job.sh", "--time", "x"],
                                         options.SBATCH_OPTIONS, "sbatch")
    assert parsed == {"job-name": "cli", "time": "1"} and rest == ["job.sh", "--time", "x"]
    with pytest.raises(options.SlurmOptionError, match="unrecognized option '--nope'"):
        options.parse_options(["--nope", "x"], options.SBATCH_OPTIONS, "sbatch")


# ---- jobs ------------------------------------------------------------------------------------------------------

def write(path, text):
    path.write_text(textwrap.dedent(text).lstrip())
    path.chmod(0o755)
    return str(path)


def sbatch(env, cwd, *args):
    return subprocess.run(["sbatch", "--parsable", *args], env=env, cwd=cwd, capture_output=True, text=True)


def show(env, job):
    out = subprocess.run(["scontrol", "show", "job", str(job)], env=env, capture_output=True, text=True).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def wait_done(env, jobs, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not subprocess.run(["squeue", "-h", "-j", ",".join(map(str, jobs))], env=env, capture_output=True,
                              text=True).stdout.strip():
            return
        time.sleep(0.1)
    raise AssertionError(f"jobs {jobs} still running after {timeout} s")


@pytest.fixture
def cluster(tmp_path):
    env = slurm_shim.environment(tmp_path / "state", kill_wait=1)
    yield env
    running = subprocess.run(["squeue", "-h", "-o", "%A"], env=env, capture_output=True, text=True).stdout.split()
    if running:  # nothing left running after a failed test
        subprocess.run(["scancel", "-Q", *sorted(set(running))], env=env, capture_output=True)


def test_time_limit_signal_then_term_then_kill_and_the_slurm_variables(cluster, tmp_path):
    """--signal=B:USR1@2 with --time=0:04: USR1 to the batch shell only at 2 s, SIGTERM to the batch shell and
    every task at 4 s, SIGKILL after KillWait (1 s) to what ignored it; the job ends TIMEOUT."""
    task = write(tmp_path / "task.sh", """
        #!/bin/bash
        trap 'echo "task $SLURM_PROCID USR1"' USR1
        trap 'echo "task $SLURM_PROCID TERM $EPOCHREALTIME"' TERM
        echo "task PROCID=$SLURM_PROCID NODEID=$SLURM_NODEID NODENAME=$SLURMD_NODENAME STEP=$SLURM_STEP_ID"
        while :; do sleep 0.05; done
        """)
    script = write(tmp_path / "job.sh", f"""
        #!/bin/bash
        #SBATCH --job-name=script-name
        #SBATCH --nodes=2
        #SBATCH --time=0:04
        #SBATCH --signal=B:USR1@2
        #SBATCH --output=out-%x-%j.txt
        echo "start $EPOCHREALTIME"
        echo "batch JOB=$SLURM_JOB_ID NAME=$SLURM_JOB_NAME NNODES=$SLURM_NNODES LIST=$SLURM_JOB_NODELIST" \\
             "NTASKS=$SLURM_NTASKS SUBMIT=$SLURM_SUBMIT_DIR RESTART=${{SLURM_RESTART_COUNT:-unset}}"
        echo "hosts $(scontrol show hostnames | tr '\\n' ' ')"
        trap 'echo "batch USR1 $EPOCHREALTIME"' USR1
        trap 'echo "batch TERM $EPOCHREALTIME"' TERM
        srun bash {task} &
        while :; do wait; sleep 0.05; done
        """)
    proc = sbatch(cluster, tmp_path, "--job-name=cli-name", script)
    assert proc.returncode == 0, proc.stderr
    job = int(proc.stdout)
    wait_done(cluster, [job])
    out = (tmp_path / f"out-cli-name-{job}.txt").read_text()  # the command line's --job-name wins
    assert f"batch JOB={job} NAME=cli-name NNODES=2 LIST=127.0.0.[1-2] NTASKS=2 SUBMIT={tmp_path} RESTART=unset" in out
    assert "hosts 127.0.0.1 127.0.0.2" in out
    assert "task PROCID=0 NODEID=0 NODENAME=127.0.0.1 STEP=0" in out and "task PROCID=1 NODEID=1 NODENAME=127.0.0.2" in out
    assert "task 0 USR1" not in out and "task 1 USR1" not in out, out  # B: only the batch shell
    # (a task gets SIGTERM twice: from the limit, and forwarded by srun, which the batch step's SIGTERM reaches too)
    times = {"".join(line.split()[:-1]): float(line.split()[-1]) for line in out.splitlines()
             if " USR1 " in line or " TERM " in line}
    start = float(next(line.split()[1] for line in out.splitlines() if line.startswith("start ")))
    # (from the script's first line, which runs a little after the shim starts the clock; slack for a busy machine)
    assert 1.3 < times["batchUSR1"] - start < 3.0, out
    for who in ("batchTERM", "task0TERM", "task1TERM"):
        assert 3.3 < times[who] - start < 5.0 and times[who] - times["batchUSR1"] > 1.5, out
    record = show(cluster, job)
    assert record["JobState"] == "TIMEOUT" and record["ExitCode"] == "137:0", record  # ended by SIGKILL


def test_requeue_array_dependency_and_refusals(cluster, tmp_path):
    requeued = write(tmp_path / "requeue.sh", """
        #!/bin/bash
        #SBATCH --requeue
        #SBATCH --open-mode=append
        #SBATCH --output=requeue-%j.txt
        echo "run RESTART=${SLURM_RESTART_COUNT:-0}"
        if [[ -z "${SLURM_RESTART_COUNT:-}" ]]; then scontrol requeue "$SLURM_JOB_ID"; sleep 30; fi
        echo "done"
        """)
    not_requeueable = write(tmp_path / "norequeue.sh", """
        #!/bin/bash
        #SBATCH --output=norequeue-%j.txt
        scontrol requeue "$SLURM_JOB_ID" || echo "refused $?"
        """)
    array = write(tmp_path / "array.sh", """
        #!/bin/bash
        #SBATCH --array=0-2%2
        #SBATCH --output=array-%A_%a.txt
        echo "task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID count $SLURM_ARRAY_TASK_COUNT job $SLURM_JOB_ID"
        sleep 0.5
        """)
    jobs = {name: sbatch(cluster, tmp_path, path) for name, path in
            (("requeue", requeued), ("norequeue", not_requeueable), ("array", array))}
    assert all(p.returncode == 0 for p in jobs.values()), {k: p.stderr for k, p in jobs.items()}
    ids = {name: int(p.stdout) for name, p in jobs.items()}
    after = write(tmp_path / "after.sh", f"""
        #!/bin/bash
        ls {tmp_path} | grep -c '^array-{ids['array']}_'
        """)
    dependent = sbatch(cluster, tmp_path, f"--dependency=afterok:{ids['array']}", "--output=after.txt", after)
    assert dependent.returncode == 0, dependent.stderr
    gpu = sbatch(cluster, tmp_path, "--gres=gpu:1", after)  # the shim's nodes have no GPU: refused as by Slurm
    assert gpu.returncode == 1 and "Requested node configuration is not available" in gpu.stderr
    wait_done(cluster, list(ids.values()) + [int(dependent.stdout)])

    out = (tmp_path / f"requeue-{ids['requeue']}.txt").read_text()
    assert out.splitlines() == ["run RESTART=0", "run RESTART=1", "done"], out  # the first run ended by the requeue
    record = show(cluster, ids["requeue"])
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", record
    assert "refused 1" in (tmp_path / f"norequeue-{ids['norequeue']}.txt").read_text()
    tasks = sorted((tmp_path / f"array-{ids['array']}_{i}.txt").read_text().split()[1] for i in range(3))
    assert tasks == ["0", "1", "2"]
    assert f"of {ids['array']} count 3" in (tmp_path / f"array-{ids['array']}_2.txt").read_text()
    assert (tmp_path / "after.txt").read_text().strip() == "3"  # ran after every array task had finished


def test_srun_kill_on_bad_exit_and_scancel(cluster, tmp_path):
    step = write(tmp_path / "step.sh", """
        #!/bin/bash
        #SBATCH --nodes=2
        #SBATCH --output=step-%j.txt
        srun --kill-on-bad-exit=1 bash -c '[[ $SLURM_PROCID == 1 ]] && exit 3; sleep 30'
        echo "srun status $?"
        """)
    hold = write(tmp_path / "hold.sh", """
        #!/bin/bash
        #SBATCH --output=hold-%j.txt
        trap 'echo "USR1"' USR1
        while :; do sleep 0.05; done
        """)
    first, second = sbatch(cluster, tmp_path, step), sbatch(cluster, tmp_path, hold)
    start = time.monotonic()
    time.sleep(1.0)
    job = int(second.stdout)
    subprocess.run(["scancel", "--signal=USR1", "--batch", str(job)], env=cluster, check=True)
    time.sleep(0.5)
    subprocess.run(["scancel", str(job)], env=cluster, check=True)
    wait_done(cluster, [int(first.stdout), job])
    assert time.monotonic() - start < 10  # the step did not wait for the 30 s sleep
    assert "srun status 3" in (tmp_path / f"step-{int(first.stdout)}.txt").read_text()
    assert "USR1" in (tmp_path / f"hold-{job}.txt").read_text()
    assert show(cluster, job)["JobState"] == "CANCELLED"


# ---- the project's sbatch scripts under the shim -----------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_train_sbatch_options_never_land_in_a_positional_slot(cluster, tmp_path):
    """`sbatch train-1node.sbatch ROW DATA_BIN --compile` (the options after DATA_BIN) trains in the default save
    dir with --compile, a third positional is the save dir, --help shows the form, a wrong call says why; and the
    scripts ask Slurm for the warning signal and requeueing."""
    env = {**cluster, "TRAIN_SH_DRY_RUN": "1", "GPUS_PER_NODE": "8", "PYTHON": os.path.join(os.path.dirname(
        __import__("sys").executable), "python")}
    script = os.path.join(ROOT, "scripts", "slurm", "train-1node.sbatch")
    calls = {"options": ["umst-t2-umst-base", "/data/bin", "--compile", "--precision", "fp16"],
             "positional": ["umst-t2-umst-base", "/data/bin", "/ckpt/x", "--tf32", "--", "optimization.max_update=7"],
             "wrong": ["umst-t2-umst-base", "/data/bin", "--bogus"]}
    jobs = {}
    for name, args in calls.items():
        proc = subprocess.run(["sbatch", "--parsable", "--gres=none", f"--output={tmp_path}/{name}.txt", script, *args],
                              env=env, cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        jobs[name] = int(proc.stdout)
    wait_done(env, list(jobs.values()), timeout=120)
    options_log = (tmp_path / "options.txt").read_text()
    command = next(line for line in options_log.splitlines() if "fairseq_cli.hydra_train" in line)
    assert f"checkpoint.save_dir={ROOT}/checkpoints/umst-t2-umst-base" in command or \
        "checkpoint.save_dir=checkpoints/umst-t2-umst-base" in command, command
    assert "+common.compile=true" in command and "common.amp=true" not in command, command  # fp16: no --amp-bf16
    positional = next(line for line in (tmp_path / "positional.txt").read_text().splitlines()
                      if "fairseq_cli.hydra_train" in line)
    assert "checkpoint.save_dir=/ckpt/x" in positional and "+common.tf32=true" in positional
    assert "optimization.max_update=7" in positional and "+common.amp_dtype=bfloat16" in positional
    assert show(env, jobs["wrong"])["JobState"] == "FAILED"
    assert "unknown option --bogus" in (tmp_path / "wrong.txt").read_text()
    help_text = subprocess.run(["bash", script, "--help"], env=env, capture_output=True, text=True).stdout
    assert "ROW DATA_BIN [SAVE_DIR] [options]" in help_text and "--precision" in help_text
    for directive in ("#SBATCH --signal=B:USR1@180", "#SBATCH --requeue", "#SBATCH --open-mode=append"):
        assert directive in open(script).read()
