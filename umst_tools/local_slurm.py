"""A Slurm cluster of its own on this machine -- Slurm's real daemons (munged, slurmctld and one slurmd per emulated
node) with a slurm.conf and every file of theirs under one directory -- for scripts/rehearse-wmt.sh and the tests
that submit real jobs.

    python3 -m umst_tools.local_slurm check                    # exit 0, or 3 with one line: why it cannot run here
    python3 -m umst_tools.local_slurm install [--log FILE]     # Debian's slurm-wlm and munge if missing (root + apt)
    python3 -m umst_tools.local_slurm start DIR [--watch PID]  # starts the cluster; prints SLURM_CONF=DIR/slurm.conf
    python3 -m umst_tools.local_slurm stop DIR                 # cancels its jobs, stops its daemons, leaves nothing

Standard library only: it runs under the system's python3 (the rehearsal starts from ``env -i``). Clients reach the
cluster through ``SLURM_CONF=DIR/slurm.conf``; two clusters started in two directories run side by side (ports and
ClusterName of their own; the ports drawn at random below the kernel's ephemeral range, so that no outgoing
connection is given one between its test and the daemon's bind).

The cluster (written for Slurm 22.05, Debian 12's slurm-wlm):

* Two nodes, ``n1`` and ``n2``, each a slurmd on this machine (``slurmd -N n1``) with all of its CPUs: a job's
  tasks on two nodes are two processes here. The names must resolve to this machine, as a rendezvous at a job's
  first node needs: ``start`` adds ``127.0.0.1 n1 n2`` to /etc/hosts when they do not resolve (the one system file
  it changes; the line stays).
* munged with a key and a socket of its own (``AuthInfo=socket=...``): the system's munge key and daemon are
  neither used nor needed.
* CPU binding enforced, as on clusters that bind by default: ``TaskPlugin=task/affinity``,
  ``TaskPluginParam=Cores``. A job step's tasks get the cores srun asks for -- one each unless srun is given
  ``--cpus-per-task`` (since 22.05 srun no longer takes the job's ``--cpus-per-task``).
* Two partitions: ``normal`` (the default; PreemptMode=OFF) and ``standby``, a lower PriorityTier whose jobs the
  jobs of ``normal`` preempt (``PreemptType=preempt/partition_prio``, ``PreemptMode=REQUEUE``): the preempted
  job's processes get SIGTERM, SIGKILL ``KillWait`` (30 s) later, and the job is requeued.
* Slurm's own timers, shortened only through the settings slurm.conf has for them:
  - a requeued job is held (``Reason=BeginTime``) for the credential lifetime + 1 s (22.05's job_mgr.c,
    ``_job_requeue_op``; slurm.conf(5) on ``AuthInfo``'s ``cred_expire``: "This also controls how long a requeued
    job must wait before starting again"): 120 s by default, ``cred_expire=CRED_EXPIRE`` (5 s, the least Slurm
    accepts) here, so a requeued job starts again about 6 s later, by itself;
  - ``sched_interval=2,bf_interval=2``: a pending job that became eligible starts within 2 s (60 s and 30 s by
    default);
  - ``MinJobAge=16``: ``sbatch --wait`` polls every 8 s instead of 2, 8, 32, 32 ... s (it stays below
    MinJobAge / 2); a finished job's record stays at least 16 s (no accounting database here: no sacct);
  - not settable: slurmctld checks time limits and sends the ``--signal`` warnings every 30 s
    (``PERIODIC_TIMEOUT``, compiled in), so a job's warning comes between 30 s before the time it asked for and
    that time (the sbatch man page allows up to 60 s early).
"""
import argparse
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time

NODES = ("n1", "n2")
DAEMONS = ("slurmctld", "slurmd", "munged")
CLIENTS = ("sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo")
CRED_EXPIRE = 5  # s: Slurm's minimum (slurm_cred.c refuses less)
KILL_WAIT = 30
MIN_JOB_AGE = 16
MARKER = "UMST_LOCAL_SLURM"  # in the daemons' environment (and so their slurmstepd's): what stop() sweeps
UNAVAILABLE = 3  # the exit status of `check`, `start` where Slurm cannot run here
HOSTS_LINE = "127.0.0.1 " + " ".join(NODES) + "  # the emulated nodes of umst_tools/local_slurm.py\n"


class Unavailable(RuntimeError):
    """Slurm cannot run here (not installed, not root, the node names): the reason in one line."""


# ---- can it run here ---------------------------------------------------------------------------------------------

def _resolves_here(name):
    """None if ``name`` resolves to this machine, else a reason."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(name, None, socket.AF_INET)}
    except socket.gaierror:
        return f"{name} does not resolve"
    if all(a.startswith("127.") for a in addresses):
        return None
    try:
        own = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    except socket.gaierror:
        own = set()
    far = sorted(addresses - own)
    return None if not [a for a in far if not a.startswith("127.")] else f"{name} resolves to {', '.join(far)}"


SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")  # where the daemons are, which a user's PATH may lack


def which(command):
    """The path of ``command`` on PATH or in the sbin directories, or None."""
    path = os.pathsep.join([os.environ.get("PATH", os.defpath), *SBIN])
    return shutil.which(command, path=path)


def _missing():
    return [c for c in DAEMONS + CLIENTS if not which(c)]


def unavailable():
    """Why Slurm cannot run here (one line), or None."""
    missing = _missing()
    if missing:
        return f"Slurm is not installed here (no {', '.join(missing)}): as root, apt-get install slurm-wlm munge " \
               f"(Debian, Ubuntu; scripts/setup_env.sh does it when run as root), or Slurm 22.05+ and munge from " \
               f"your distribution"
    if os.geteuid() != 0:
        return "not root: the local cluster's slurmd runs jobs as root (SlurmUser and SlurmdUser root)"
    for name in NODES:
        why = _resolves_here(name)
        if why and not why.endswith("does not resolve"):
            return f"the node name {why}, not to this machine: the local cluster's nodes must be this machine"
        if why and not os.access("/etc/hosts", os.W_OK):
            return f"{why} and /etc/hosts is not writable: add '127.0.0.1 {' '.join(NODES)}' to it"
    return None


def slurm_version():
    """``slurmctld -V``: e.g. "slurm-wlm 22.05.8" (``sbatch --version`` says the same once a slurm.conf is set)."""
    out = subprocess.run([which("slurmctld"), "-V"], capture_output=True, text=True)
    return (out.stdout or out.stderr).strip()


def install(log=None, say=print, dry_run=False):
    """Debian's slurm-wlm and munge, when missing, as root with apt-get (``apt-get update`` only when the install
    fails without it). One line says what was done; returns 0, or 1 when apt-get failed (its output in ``log``)."""
    missing = _missing()
    if not missing:
        say(f"Slurm present ({slurm_version()}): the WMT rehearsal's local cluster")
        return 0
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        say(f"Slurm not installed (no {', '.join(missing)}) and not installable here ("
            f"{'not root' if os.geteuid() != 0 else 'no apt-get'}): the WMT rehearsal and the tests that need "
            f"Slurm skip")
        return 0
    if dry_run:
        say("would install Slurm for the WMT rehearsal's local cluster: apt-get install -y slurm-wlm munge")
        return 0
    say("installing Slurm for the WMT rehearsal's local cluster (apt-get install slurm-wlm munge)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    out = open(log, "a") if log else subprocess.DEVNULL
    try:
        command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "slurm-wlm", "munge"]
        if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], stdout=out, stderr=subprocess.STDOUT, env=env)
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env).returncode != 0:
                say(f"FAILED: apt-get install slurm-wlm munge{f' (its output: {log})' if log else ''}")
                return 1
    finally:
        if log:
            out.close()
    return 0


# ---- the cluster ---------------------------------------------------------------------------------------------------

LISTEN_PORTS = (10000, 30000)  # where the daemons' ports are drawn, below Linux's default ephemeral range


def _ephemeral_range():
    """The ports the kernel hands out for outgoing connections (/proc/sys/net/ipv4/ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _free_ports(n, rng=None):
    """``n`` ports free now, drawn at random outside the ephemeral range. A port the kernel picks (bind to port
    0) is an ephemeral one: between its test here and the daemon's own bind, any outgoing connection on the machine
    -- slurmd's first to slurmctld among them -- may be given it. Ports outside that range are taken only by a
    program that asks for them by number; drawing at random keeps two clusters started together apart."""
    rng = rng or secrets.SystemRandom()
    low, high = _ephemeral_range()
    candidates = [q for q in range(*LISTEN_PORTS) if not low <= q <= high]
    sockets = []
    try:
        for port in rng.sample(candidates, min(len(candidates), 200)):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            sockets.append(s)
            if len(sockets) == n:
                return [s.getsockname()[1] for s in sockets]
        raise RuntimeError(f"no {n} free ports among 200 drawn from {LISTEN_PORTS[0]}-{LISTEN_PORTS[1] - 1}")
    finally:
        for s in sockets:
            s.close()


def _cpus():
    return len(os.sched_getaffinity(0))


def paths(work):
    work = os.path.abspath(work)
    return {"work": work, "conf": os.path.join(work, "slurm.conf"), "state": os.path.join(work, "state"),
            "spool": os.path.join(work, "spool"), "run": os.path.join(work, "run"), "log": os.path.join(work, "log"),
            "munge": os.path.join(work, "munge"), "socket": os.path.join(work, "munge", "munge.socket"),
            "key": os.path.join(work, "munge", "munge.key")}


def slurm_conf(work, host, ports, cpus, user="root"):
    p = paths(work)
    ctld, *nodes = ports
    lines = [
        f"# A cluster of its own on this machine (umst_tools/local_slurm.py); every file under {p['work']}",
        f"ClusterName=umst{secrets.token_hex(4)}",  # (lowercase letters and digits; one per cluster)
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={p['socket']},cred_expire={CRED_EXPIRE}",
        f"StateSaveLocation={p['state']}",
        f"SlurmdSpoolDir={p['spool']}/%n",
        f"SlurmctldPidFile={p['run']}/slurmctld.pid",
        f"SlurmdPidFile={p['run']}/slurmd-%n.pid",
        f"SlurmctldLogFile={p['log']}/slurmctld.log",
        f"SlurmdLogFile={p['log']}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/affinity",
        "TaskPluginParam=Cores",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "MpiDefault=none",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=2,bf_interval=2",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        f"KillWait={KILL_WAIT}",
        f"MinJobAge={MIN_JOB_AGE}",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        "MailProg=/bin/true",
    ]
    for name, port in zip(NODES, nodes):
        lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} "
                     f"Sockets=1 CoresPerSocket={cpus} ThreadsPerCore=1 State=UNKNOWN")
    all_nodes = ",".join(NODES)
    lines += [f"PartitionName=normal Nodes={all_nodes} Default=YES MaxTime=INFINITE State=UP PriorityTier=2 "
              f"PreemptMode=OFF",
              f"PartitionName=standby Nodes={all_nodes} MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE"]
    return "\n".join(lines) + "\n"


def environment(work):
    """The environment of a client of this cluster: the caller's, with SLURM_CONF."""
    return {**os.environ, "SLURM_CONF": paths(work)["conf"]}


def _ensure_node_names():
    for name in NODES:
        why = _resolves_here(name)
        if why is None:
            continue
        if not why.endswith("does not resolve") or not os.access("/etc/hosts", os.W_OK):
            raise Unavailable(unavailable() or why)
        with open("/etc/hosts", "a", encoding="utf-8") as f:
            f.write(HOSTS_LINE)
        return


def _read_pid(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _run(cmd, work, **kwargs):
    return subprocess.run(cmd, env=environment(work), capture_output=True, text=True, **kwargs)


def _tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def start(work, watch=None, timeout=60.0):
    """Start munged, slurmctld and a slurmd per node with a slurm.conf of their own in ``work``; return the client
    environment's SLURM_CONF. With ``watch``: a watcher process stops the cluster once that process is gone (the
    caller killed by a signal it cannot trap)."""
    why = unavailable()
    if why:
        raise Unavailable(why)
    _ensure_node_names()
    p = paths(work)
    if len(p["socket"]) > 100:
        raise ValueError(f"{p['socket']}: too long for a Unix socket path; give a shorter directory")
    if os.path.exists(p["conf"]):
        raise ValueError(f"{p['conf']} exists: a cluster was started in {p['work']} (stop it: python3 -m "
                         f"umst_tools.local_slurm stop {p['work']}) -- give a new directory")
    for d in ("state", "run", "log", "munge"):
        os.makedirs(p[d], mode=0o700, exist_ok=True)
    for name in NODES:
        os.makedirs(os.path.join(p["spool"], name), mode=0o700, exist_ok=True)
    with open(p["key"], "wb") as f:
        f.write(secrets.token_bytes(1024))
    os.chmod(p["key"], 0o400)
    host = socket.gethostname().split(".")[0]
    user = pwd.getpwuid(os.geteuid()).pw_name
    with open(p["conf"], "w") as f:
        f.write(slurm_conf(work, host, _free_ports(1 + len(NODES)), _cpus(), user))
    env = {**os.environ, "SLURM_CONF": p["conf"], MARKER: p["work"]}
    launches = [[which("munged"), "--force", f"--socket={p['socket']}", f"--key-file={p['key']}",
                 f"--pid-file={p['munge']}/munged.pid", f"--log-file={p['munge']}/munged.log",
                 f"--seed-file={p['munge']}/munged.seed"],
                [which("slurmctld"), "-f", p["conf"]]] + [[which("slurmd"), "-f", p["conf"], "-N", name]
                                                          for name in NODES]
    try:
        if watch:
            _start_watcher(work, watch, env)
        for cmd in launches:  # each daemonizes: the command returns once it runs
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}: {(out.stderr or out.stdout).strip()}")
        deadline = time.monotonic() + timeout
        while True:
            out = _run(["sinfo", "-h", "-N", "-o", "%N %t"], work)
            states = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
            if out.returncode == 0 and all(states.get(n) == "idle" for n in NODES):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the nodes are not idle after {timeout:.0f} s ({states or out.stderr.strip()}); "
                                   f"slurmctld's log ends:\n{_tail(os.path.join(p['log'], 'slurmctld.log'))}")
            time.sleep(0.3)
    except BaseException:
        stop(work)
        raise
    return p["conf"]


def _start_watcher(work, pid, env):
    p = paths(work)
    log = open(os.path.join(p["log"], "watcher.log"), "a")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    watcher = subprocess.Popen([sys.executable, "-m", "umst_tools.local_slurm", "watch", p["work"], str(pid)],
                               cwd=here, env={**env, "PYTHONPATH": here}, stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    with open(os.path.join(p["run"], "watcher.pid"), "w") as f:
        f.write(f"{watcher.pid}\n")


def watch(work, pid):
    """Poll ``pid``; once it is gone (or the cluster stopped), stop the cluster and exit."""
    p = paths(work)
    try:
        with open(f"/proc/{pid}/stat") as f:
            started = f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        started = None

    def same_process():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return fields[0] != "Z" and fields[19] == started
        except OSError:
            return False

    while started and same_process() and not os.path.exists(os.path.join(p["run"], "stopped")):
        time.sleep(1.0)
    if not os.path.exists(os.path.join(p["run"], "stopped")):
        left = stop(work)
        print(f"watcher: process {pid} is gone; cluster stopped{f', left: {left}' if left else ''}", flush=True)


def _ancestors():
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            break
    return out


def processes(work):
    """The pids of every process of this cluster: its daemons, their slurmstepd, its jobs' processes (they have
    SLURM_CONF=WORK/slurm.conf or the daemons' marker in their environment, or WORK in their command line)."""
    p = paths(work)
    needles = (f"SLURM_CONF={p['conf']}".encode(), f"{MARKER}={p['work']}".encode())
    skip, found = _ancestors(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            environ = []
        if (any(e in needles for e in environ) or p["work"] + "/" in _cmdline(pid)) and _alive(pid):
            found.append(pid)
    return found


def stop(work):
    """Cancel the cluster's jobs, stop its daemons (by their pid files), then end whatever of it is left (jobs'
    processes, slurmstepd) by pid. Returns the pids still alive afterwards (none expected)."""
    p = paths(work)
    if not os.path.isdir(p["run"]):
        return []
    with open(os.path.join(p["run"], "stopped"), "w") as f:
        f.write(f"{time.time()}\n")
    ctld = _read_pid(os.path.join(p["run"], "slurmctld.pid"))
    if ctld and _alive(ctld):
        try:
            _run(["scancel", "--quiet", "--user", pwd.getpwuid(os.geteuid()).pw_name], work, timeout=30)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                out = _run(["squeue", "-h", "-o", "%i"], work, timeout=30)
                if out.returncode != 0 or not out.stdout.strip():
                    break
                time.sleep(0.3)
        except subprocess.TimeoutExpired:
            pass
    daemons = []
    for name in [f"slurmd-{n}.pid" for n in NODES] + ["slurmctld.pid"]:
        pid = _read_pid(os.path.join(p["run"], name))
        if pid and p["conf"] in _cmdline(pid):
            daemons.append(pid)
    munged = _read_pid(os.path.join(p["munge"], "munged.pid"))
    if munged and p["socket"] in _cmdline(munged):
        daemons.append(munged)
    watcher = _read_pid(os.path.join(p["run"], "watcher.pid"))
    if watcher and watcher != os.getpid() and "umst_tools.local_slurm" in _cmdline(watcher):
        daemons.append(watcher)
    for pid in daemons:  # slurmd before slurmctld before munged: each still has what it talks to
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        _wait_gone([pid], 10)
    for pid in processes(work) + daemons:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return _wait_gone(list(set(processes(work) + daemons)), 10)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="exit 0 if Slurm can run here, else 3 with the reason in one line")
    i = sub.add_parser("install", help="apt-get install slurm-wlm munge when missing (root, apt-get)")
    i.add_argument("--log", help="apt-get's output goes here")
    i.add_argument("--prefix", default="", help="put before the one line printed")
    i.add_argument("--dry-run", action="store_true", help="say what it would do")
    s = sub.add_parser("start", help="start the cluster in DIR (a new directory)")
    s.add_argument("dir")
    s.add_argument("--watch", type=int, help="stop the cluster once this process is gone")
    t = sub.add_parser("stop", help="stop the cluster of DIR; exit 1 if any of its processes is left")
    t.add_argument("dir")
    w = sub.add_parser("watch")
    w.add_argument("dir")
    w.add_argument("pid", type=int)
    args = parser.parse_args(argv)
    if args.command == "check":
        why = unavailable()
        if why:
            print(why)
            return UNAVAILABLE
        print(f"Slurm can run here: {slurm_version()}")
        return 0
    if args.command == "install":
        return install(args.log, lambda line: print(args.prefix + line, flush=True), args.dry_run)
    if args.command == "start":
        try:
            conf = start(args.dir, args.watch)
        except Unavailable as e:
            print(str(e), file=sys.stderr)
            return UNAVAILABLE
        except (RuntimeError, ValueError) as e:
            print(f"local_slurm: could not start the cluster in {args.dir}: {e}", file=sys.stderr)
            return 1
        print(f"SLURM_CONF={conf}")
        return 0
    if args.command == "stop":
        left = stop(args.dir)
        if left:
            print(f"local_slurm: processes of {args.dir} still alive after stop: "
                  + ", ".join(f"{pid} ({_cmdline(pid)[:80]})" for pid in left), file=sys.stderr)
            return 1
        return 0
    watch(args.dir, args.pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
