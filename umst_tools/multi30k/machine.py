"""This machine and the training processes: CPU time, reaping, the hardware a run recorded."""
import ctypes
import os
import platform
import signal

from umst_tools.multi30k.config import CPU_TIME
from umst_tools.multi30k.files import read_json, write_json
from umst_tools.multi30k.logs import scaled_to_budget, training_segments


def process_cpu_seconds(pid):
    """User + system CPU seconds of a live process so far (Linux /proc), None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state is field 3
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15
    except (OSError, IndexError, ValueError):
        return None


def reap(proc):
    """(exit code, CPU seconds) of a finished training process, (None, CPU seconds so far) of a running
    one: os.wait4 gives a finished child's exact user + system time."""
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    if pid == 0:
        return None, process_cpu_seconds(proc.pid)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def record_cpu_time(save, started, seconds):
    """Store a training segment's CPU seconds in SAVE/cpu-time.json (atomically: a kill leaves the old file)."""
    if seconds is None:
        return
    path = os.path.join(save, CPU_TIME)
    cpu = read_json(path) if os.path.exists(path) else {}
    cpu[started] = round(seconds, 1)
    write_json(path, cpu, indent=1)


def training_cpu_time(save, max_update):
    """(CPU seconds of training ``max_update`` updates, updates it was measured over): CPU time per update
    over the segments whose CPU time the runner recorded, times the budget, as training_time() does with
    wall time; (None, 0) where none was recorded (a run logged before the runner recorded CPU time)."""
    path = os.path.join(save, CPU_TIME)
    cpu = read_json(path) if os.path.exists(path) else {}
    return scaled_to_budget([(s, cpu[s["started"]]) for s in training_segments(os.path.join(save, "train.log"))
                             if s.get("started") in cpu], max_update)


def hardware_of(args, results, runs, default=None):
    """The hardware a picture of RUNS ((row, seed) pairs) names: --hardware first, as in the table; else
    the machines those runs recorded; else ``default``, or this machine."""
    machines = list(dict.fromkeys(results[run]["machine"] for run in runs if "machine" in results.get(run, {})))
    return args.hardware or " and ".join(machines) or default or this_machine()


def this_machine():
    """The CPU this runner trains on, as /proc/cpuinfo names it, with its vector extensions and core
    count: CPU times are comparable only between runs of the same machine (a later session may get
    another). Falls back to the platform module off Linux."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields:
        name += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    flags = set(fields.get("flags", "").split())
    vector = next((v for f, v in (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2")) if f in flags), None)
    return f"{name}{', ' + vector if vector else ''}, {os.cpu_count()} cores"


def die_with_parent():
    """In the training's process, before exec: be killed when the runner dies (Linux PR_SET_PDEATHSIG),
    so that a killed runner never leaves a training that a re-run would meet writing the same files."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:  # not Linux: an orphan may go on; the lock file still stops a second runner
        pass
