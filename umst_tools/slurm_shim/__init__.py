"""A Slurm stand-in that runs jobs on this machine as a cluster would, to rehearse the project's Slurm scripts
(scripts/rehearse-wmt.sh) before spending cluster hours, and to test them.

``umst_tools/slurm_shim/bin`` holds ``sbatch``, ``srun``, ``scontrol``, ``squeue`` and ``scancel``; put it first on
PATH. Python's standard library only (the commands run under any ``python3``, outside the project's venv, as
Slurm's own commands do). What a job sees, as on a cluster:

* ``sbatch`` reads the ``#SBATCH`` directives (the command line wins), copies the script and runs the copy on the
  job's first node, from ``--chdir`` or the submit directory, with the submitting shell's environment and the
  SLURM_* variables (SLURM_JOB_ID, SLURM_JOB_NAME, SLURM_JOB_NODELIST, SLURM_NNODES, SLURM_NTASKS,
  SLURM_SUBMIT_DIR, SLURM_ARRAY_JOB_ID / SLURM_ARRAY_TASK_ID / ..._COUNT / _MIN / _MAX, SLURM_RESTART_COUNT once
  restarted, ...); ``--output`` / ``--error`` with their ``%j %A %a %x %N %u`` patterns and ``--open-mode``;
  ``--array`` (with a ``%N`` throttle), ``--dependency`` (afterok / afterany / afternotok), ``--wait``,
  ``--parsable``. Resource requests are recorded, not enforced, except GPUs: the shim's nodes have
  ``SLURM_SHIM_GPUS_PER_NODE`` (0), and asking for more fails the submission as Slurm does.
* The nodes are ``127.0.0.1``, ``127.0.0.2``, ...: names that resolve to this machine, so a rendezvous at the
  first node works. ``srun`` starts the step's tasks as local processes with SLURM_PROCID, SLURM_NODEID,
  SLURM_LOCALID, SLURM_STEP_ID, each task in a process group of its own (as each node's slurmstepd holds its
  tasks), forwards the signals it gets to every task, and with ``--kill-on-bad-exit`` ends the step when a task
  fails.
* The time limit as Slurm enforces it: ``--signal=[B:]SIG@T`` sends SIG T seconds before the limit (to the batch
  shell only with ``B:``, else to every task of the job's steps); at the limit SIGCONT and SIGTERM go to the batch
  step and every job step, SIGKILL after KillWait (``SLURM_SHIM_KILL_WAIT``, 30 s); the job ends TIMEOUT. Slurm
  checks limits about once a minute and may signal up to a minute early; the shim is exact to 0.05 s.
* ``scontrol requeue ID`` (allowed for jobs submitted with ``--requeue``; ``SLURM_SHIM_JOB_REQUEUE=1`` allows it
  for every job, as JobRequeue=1 does) ends a running job as at the limit and runs it again, with
  SLURM_RESTART_COUNT one higher; ``scontrol show job``, ``show hostnames``, ``update JobId= TimeLimit=``.
* ``scancel ID`` ends a job (state CANCELLED); ``scancel --signal=SIG [--batch|--full] ID`` only signals it.

State lives in ``SLURM_SHIM_STATE`` (a directory; default ``$TMPDIR/umst-slurm-shim-<uid>``): one JSON record per
job (``jobs/ID.json``), the runner's log (``runner-ID.log``) and the script copies (``spool/``).
"""
import os

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def environment(state_dir, base=None, **settings):
    """An environment with the shim's commands first on PATH and its state in ``state_dir``; ``settings`` are
    the slurm.conf-like variables without their prefix (``kill_wait=2`` sets SLURM_SHIM_KILL_WAIT=2)."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["SLURM_SHIM_STATE"] = str(state_dir)
    for key, value in settings.items():
        env[f"SLURM_SHIM_{key.upper()}"] = str(value)
    return env
