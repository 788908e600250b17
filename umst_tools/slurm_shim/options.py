"""Slurm's option syntax, as sbatch, srun and scontrol read it: time limits, ``--signal``, ``--array``,
``--dependency``, host lists, ``#SBATCH`` directives and the ``%`` patterns of ``--output``.

Pure functions, no state; :mod:`umst_tools.slurm_shim.commands` builds the commands from them.
"""
import re
import signal


class SlurmOptionError(ValueError):
    """An option Slurm would refuse; the message is what the command prints before exiting 1."""


# ---- time limits (sbatch --time, scontrol update TimeLimit=) ----------------------------------------------------

def parse_time(text):
    """Slurm's time formats -- "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
    "days-hours:minutes", "days-hours:minutes:seconds" -- as seconds; None for UNLIMITED / INFINITE."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "-1"):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        raise SlurmOptionError(f"Invalid time limit specification: {text!r}")
    days, a, b, c = m.groups()
    a, b, c = int(a), None if b is None else int(b), None if c is None else int(c)
    if days is not None:  # days-hours[:minutes[:seconds]]
        return ((int(days) * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    if b is None:  # minutes
        return a * 60
    if c is None:  # minutes:seconds
        return a * 60 + b
    return (a * 60 + b) * 60 + c  # hours:minutes:seconds


def format_time(seconds):
    """As squeue and scontrol print a duration: [days-]hours:minutes:seconds (UNLIMITED for None)."""
    if seconds is None:
        return "UNLIMITED"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{days}-" if days else "") + f"{hours:02d}:{minutes:02d}:{secs:02d}"


# ---- signals ------------------------------------------------------------------------------------------------------

def parse_signal_name(text):
    """"USR1", "SIGUSR1" or "10" as a signal number."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    name = text.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return int(getattr(signal, name))
    except AttributeError:
        raise SlurmOptionError(f"Invalid signal specification: {text!r}") from None


def parse_signal_option(text):
    """sbatch --signal=[{R|B}:]<sig_num>[@sig_time]: (signal number, seconds before the time limit (default 60),
    whether only the batch shell gets it (B:))."""
    m = re.fullmatch(r"(?:([RB]+):)?([A-Za-z0-9]+)(?:@(\d+))?", text.strip())
    if not m:
        raise SlurmOptionError(f"Invalid --signal specification: {text!r}")
    flags, sig, when = m.groups()
    return parse_signal_name(sig), int(when) if when is not None else 60, "B" in (flags or "")


# ---- job arrays -----------------------------------------------------------------------------------------------------

def parse_array(text):
    """sbatch --array: "0-15", "0,6,16-32", "0-15:4", each optionally ending in "%N" (at most N tasks at once).
    Returns (sorted task ids, N or None)."""
    spec, _, throttle = text.strip().partition("%")
    ids = set()
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if not m:
            raise SlurmOptionError(f"Invalid job array specification: {text!r}")
        first, last, step = int(m.group(1)), m.group(2), int(m.group(3) or 1)
        last = first if last is None else int(last)
        if last < first or step < 1:
            raise SlurmOptionError(f"Invalid job array specification: {text!r}")
        ids.update(range(first, last + 1, step))
    if throttle and not throttle.isdigit():
        raise SlurmOptionError(f"Invalid job array specification: {text!r}")
    return sorted(ids), int(throttle) if throttle else None


# ---- dependencies ----------------------------------------------------------------------------------------------------

DEPENDENCY_KINDS = ("afterok", "afterany", "afternotok")


def parse_dependency(text):
    """sbatch --dependency=afterok:ID[:ID...][,afterany:ID...]: [(kind, job id)]. A job id may be an array's: the
    dependency is on all its tasks."""
    out = []
    for part in re.split(r"[,?]", text.strip()):
        kind, _, ids = part.partition(":")
        if kind not in DEPENDENCY_KINDS or not ids:
            raise SlurmOptionError(f"Job dependency problem: {text!r} (the shim knows {', '.join(DEPENDENCY_KINDS)})")
        for job in ids.split(":"):
            if not job.isdigit():
                raise SlurmOptionError(f"Job dependency problem: {text!r}")
            out.append((kind, int(job)))
    return out


# ---- host lists ------------------------------------------------------------------------------------------------------

def expand_hostlist(text):
    """scontrol show hostnames: "node[1-3,7],gpu-a" -> ["node1", "node2", "node3", "node7", "gpu-a"] (zero
    padding kept: "n[01-03]" -> n01, n02, n03)."""
    names, depth, start = [], 0, 0
    parts = []
    for i, ch in enumerate(text):  # split at the commas outside brackets
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for part in filter(None, (p.strip() for p in parts)):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", part)
        if not m:
            if "[" in part or "]" in part:
                raise SlurmOptionError(f"Invalid hostlist: {text!r}")
            names.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            first, _, last = r.partition("-")
            last = last or first
            if not (first.isdigit() and last.isdigit()):
                raise SlurmOptionError(f"Invalid hostlist: {text!r}")
            width = len(first) if first.startswith("0") else 0
            for n in range(int(first), int(last) + 1):
                names.append(f"{prefix}{str(n).zfill(width)}{suffix}")
    return names


def compress_hostlist(names):
    """The inverse of :func:`expand_hostlist` for names "<prefix><number>": consecutive numbers of one prefix in
    one bracket ("127.0.0.[1-2]"); other names as they are."""
    groups, order = {}, []
    for name in names:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        key = m.group(1) if m else name
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(m.group(2)) if m else None)
    out = []
    for key in order:
        numbers = groups[key]
        if None in numbers or len(numbers) == 1:
            out += [key if n is None else f"{key}{n}" for n in numbers]
            continue
        numbers = sorted(set(numbers))
        ranges, first = [], numbers[0]
        for prev, n in zip(numbers, numbers[1:] + [None]):
            if n != prev + 1:
                ranges.append(f"{first}-{prev}" if prev != first else f"{first}")
                first = n
        out.append(f"{key}[{','.join(ranges)}]")
    return ",".join(out)


# ---- #SBATCH directives and command-line options -------------------------------------------------------------------

# long name -> (short letter or None, takes a value). Resource requests the shim records but does not enforce
# (partition, account, memory, CPUs) are accepted so that a real cluster's script runs unchanged.
SBATCH_OPTIONS = {
    "job-name": ("J", True), "nodes": ("N", True), "ntasks": ("n", True), "ntasks-per-node": (None, True),
    "time": ("t", True), "signal": (None, True), "requeue": (None, False), "no-requeue": (None, False),
    "output": ("o", True), "error": ("e", True), "open-mode": (None, True), "array": ("a", True),
    "dependency": ("d", True), "kill-on-invalid-dep": (None, True), "wait": ("W", False), "parsable": (None, False),
    "chdir": ("D", True), "export": (None, True), "gres": (None, True), "gpus": ("G", True),
    "gpus-per-node": (None, True), "cpus-per-task": ("c", True), "partition": ("p", True), "account": ("A", True),
    "qos": ("q", True), "mem": (None, True), "mem-per-cpu": (None, True), "mem-per-gpu": (None, True),
    "exclusive": (None, False), "constraint": ("C", True), "mail-type": (None, True), "mail-user": (None, True),
    "hint": (None, True), "comment": (None, True), "nice": (None, True), "reservation": (None, True),
}

SRUN_OPTIONS = {
    "nodes": ("N", True), "ntasks": ("n", True), "ntasks-per-node": (None, True), "kill-on-bad-exit": ("K", False),
    "cpus-per-task": ("c", True), "job-name": ("J", True), "export": (None, True), "gres": (None, True),
    "gpus": ("G", True), "gpus-per-node": (None, True), "overlap": (None, False), "exclusive": (None, False),
    "unbuffered": ("u", False), "mpi": (None, True), "cpu-bind": (None, True), "distribution": ("m", True),
    "chdir": ("D", True), "mem": (None, True), "label": ("l", False),
}


def parse_options(argv, table, command, stop_at_positional=True):
    """Slurm's getopt: ``--name=value``, ``--name value``, ``-Xvalue``, ``-X value``, flags. Returns
    ({long name: value or True}, the remaining arguments): from the first positional argument on (the script or
    program and its arguments), or with ``stop_at_positional=False`` every positional argument."""
    shorts = {short: name for name, (short, _) in table.items() if short}
    options, positionals, i = {}, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if name not in table:
                raise SlurmOptionError(f"{command}: unrecognized option '--{name}'")
            takes_value = table[name][1]
            if takes_value and not eq:
                if i + 1 >= len(argv):
                    raise SlurmOptionError(f"{command}: option '--{name}' requires an argument")
                value = argv[i + 1]
                i += 1
            elif not takes_value:
                value = value if eq else True
            options[name] = value
        elif arg.startswith("-") and len(arg) > 1:
            letter = arg[1]
            if letter not in shorts:
                raise SlurmOptionError(f"{command}: invalid option -- '{letter}'")
            name = shorts[letter]
            if table[name][1]:
                if len(arg) > 2:
                    value = arg[2:]
                elif i + 1 < len(argv):
                    value = argv[i + 1]
                    i += 1
                else:
                    raise SlurmOptionError(f"{command}: option requires an argument -- '{letter}'")
                options[name] = value
            else:
                options[name] = True
        elif stop_at_positional:
            break
        else:
            positionals.append(arg)
        i += 1
    return options, positionals + argv[i:]


def script_directives(text):
    """The ``#SBATCH`` options of a batch script, in order: sbatch reads them from the lines after the shebang up
    to the first line that is neither a comment nor blank."""
    args = []
    for line in text.splitlines()[1:] if text.startswith("#!") else text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        m = re.match(r"#SBATCH\s+(.*)", stripped)
        if m:
            directive = m.group(1).split(" #", 1)[0]  # a comment after the option
            args += directive.split()
    return args


def expand_output_pattern(pattern, job):
    """--output / --error file name patterns: %j job id, %A array's job id, %a array index, %x job name,
    %N first node, %u user, %% a percent sign."""
    import getpass

    values = {"j": str(job["job_id"]), "A": str(job.get("array_job_id") or job["job_id"]),
              "a": str(job["array_task_id"]) if job.get("array_task_id") is not None else "4294967294",
              "x": job["name"], "N": job["nodes"][0], "u": getpass.getuser(), "%": "%"}
    return re.sub(r"%([jAaxNu%])", lambda m: values[m.group(1)], pattern)
