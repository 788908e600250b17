"""fairseq's command-line tools, each run in its own process forked from a Python that has already imported
fairseq: what fairseq's own tests/test_binaries.py gets by calling ``train.main`` in-process, without sharing
the test's process.

Why: importing torch, fairseq and everything fairseq imports (scikit-learn and SciPy for one audio task) takes
about 5 s of CPU per process, and the suite runs over a hundred of these tools. A forked child pays nothing
for it.

What stays as in a fresh ``fairseq-train`` process: the imports and their order (the server imports the
tool's module, as the console script does before calling its main: fairseq_cli/train.py sets up logging, then
imports fairseq), the argv, the environment, the working directory, stdin / stdout / stderr (files), the exit
status (``sys.exit(cli_main())``; a traceback and status 1 for an exception), the plugin (imported by
``--user-dir`` in the child: its patches are the child's own), fresh torch / inductor state (the server only
imports), the warnings the imports show (on stderr before anything else: each child shows again those the server's
imports showed), and the interpreter's own shutdown at exit (the child leaves by ``SystemExit`` through the server's
frames: non-daemon threads joined, atexit handlers, then finalization -- objects and open files of the run
finalized, their errors printed). What differs: nothing in
the environment (a server starts with the caller's environment, and a call with another one first ends the tool's
servers and starts them again in it: an environment variable read at import time has the call's value, and a test
process whose environment changed -- torch writes its inductor cache directory into it at the first compile --
keeps forking); a traceback has two frames of this file where the console script has its own,
and a warning whose stacklevel passes the script's frame names this file instead of ``sys:1``; the objects the
server's imports made are frozen for the garbage collector (``gc.freeze`` after a collection: a forked run's
shutdown costs 0.2 s of CPU more than ``os._exit``, where it cost 0.7 s unfrozen).
A real process also runs for ``--compile`` (inductor's cache settings), for any command that is not a known
entry point, and for every command when UMST_TEST_FRESH_PROCESSES=1.

String hashing. Python draws a random hash seed per process (set order of strings depends on it); a forked child
has its server's, which cannot change after start-up. Each tool has two servers, each started with a random
``PYTHONHASHSEED`` of its own (unless the caller's environment sets one, which then holds for every run, as in a
fresh process), and its runs alternate between them: no two consecutive runs of a tool share a seed, so a result
that depends on the seed shows as two runs that differ, as with fresh processes. (A fresh seed for every run
would need a server per run, which costs the imports the server saves: about 2.8 s of CPU per run.) The child's
environment is the caller's, without the server's ``PYTHONHASHSEED``; ``CompletedProcess.hash_seed`` says which
seed a run had.

Two servers per tool and test process (the pytest-xdist worker), the first started at the tool's first use, the
second at its second; requests are serial.
"""
import gc
import importlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import warnings

# console script -> (module, function), as fairseq's setup.py declares them
ENTRY_POINTS = {
    "fairseq-train": ("fairseq_cli.train", "cli_main"),
    "fairseq-generate": ("fairseq_cli.generate", "cli_main"),
    "fairseq-interactive": ("fairseq_cli.interactive", "cli_main"),
    "fairseq-validate": ("fairseq_cli.validate", "cli_main"),
    "fairseq-preprocess": ("fairseq_cli.preprocess", "cli_main"),
}
MODULES = ("umst_plugin.preprocess",)  # python -m MODULE


def entry_point(cmd, python):
    """("script", name) / ("module", name) when ``cmd`` runs a known entry point with ``python``, else None."""
    name = os.path.basename(cmd[0])
    if name in ENTRY_POINTS and os.path.dirname(cmd[0]) == os.path.dirname(python):
        return ("script", name)
    if len(cmd) > 2 and cmd[0] == python and cmd[1] == "-m" and cmd[2] in MODULES:
        return ("module", cmd[2])
    return None


IMPORT_WARNINGS = []  # what the server's imports warned, shown again by each child (serve)

# ---- the server -------------------------------------------------------------------------------------------------

def _child(request, protocol):
    """In the forked child: become the requested process, run it, and leave with its status through the
    interpreter's own shutdown (a ``SystemExit`` that unwinds the server's frames). Never returns."""
    try:
        for stream in protocol:  # the server's pipes: closed as files (a closed descriptor left in a file
            stream.close()       # object would be closed again, with an error, at finalization)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, (path, mode) in enumerate([(request["stdin"], os.O_RDONLY),
                                           (request["stdout"], os.O_WRONLY | os.O_TRUNC),
                                           (request["stderr"], os.O_WRONLY | os.O_TRUNC)]):
            opened = os.open(path, mode)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(0, "r", closefd=False)
        for message, category, filename, lineno, line in IMPORT_WARNINGS:
            warnings.showwarning(message, category, filename, lineno, None, line)
        kind, name = request["entry"]
        # sys.path[0] as python sets it: the script's folder (bin/ of a console script), the cwd for -m
        sys.path[0] = os.path.dirname(request["argv0"]) if kind == "script" else os.getcwd()
        if kind == "script":
            module, function = ENTRY_POINTS[name]
            sys.argv = [request["argv0"], *request["args"]]
            code = _status_of(lambda: sys.exit(getattr(sys.modules[module], function)()))
        else:
            import runpy

            sys.argv = [name, *request["args"]]  # runpy sets argv[0] to the module's file
            code = _status_of(lambda: runpy.run_module(name, run_name="__main__", alter_sys=True))
    except BaseException:  # noqa: BLE001  (the harness itself failed: say so on the child's stderr)
        sys.excepthook(*sys.exc_info())
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(1)
    raise SystemExit(code)  # the interpreter's own shutdown: threads joined, atexit, finalization


def _status_of(run):
    """The exit status Python gives a script that runs ``run``: SystemExit's code, 1 and a traceback for an
    exception."""
    try:
        run()
        return 0
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001
        sys.excepthook(*sys.exc_info())
        return 1


def preload(entry):
    """The module a real process of ``entry`` imports before its main: for fairseq's tools that is fairseq's
    own order (fairseq_cli/train.py sets up logging, then imports fairseq; generate.py imports fairseq first)."""
    kind, name = entry
    return ENTRY_POINTS[name][0] if kind == "script" else name


def serve(request_fd, answer_fd, kind, name):
    """Import what a real ``kind`` ``name`` process imports first; then read requests (one JSON line each) on
    ``request_fd``, fork a child per request, answer its status on ``answer_fd``."""
    sys.path.remove(os.path.dirname(os.path.abspath(__file__)))  # tests/ is not on a real process's path
    # the warnings the imports show (torch 2.14 deprecates torch.jit.script, which fairseq calls at import): a
    # fresh process prints them on its stderr before anything else, so each child shows them again on its own
    # (recorded through showwarning, not warnings.catch_warnings, which would undo the filters the imports set)
    show = warnings.showwarning
    warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: \
        IMPORT_WARNINGS.append((message, category, filename, lineno, line))
    try:
        importlib.import_module(preload((kind, name)))
    finally:
        warnings.showwarning = show
    if threading.active_count() != 1:  # forking a threaded process is unsafe: refuse, the client falls back
        os.write(answer_fd, b'{"error": "threads after the imports"}\n')
        return
    # what the imports left, collected, the rest frozen (gc.freeze, as its documentation advises before a fork):
    # a child's collections, its interpreter's shutdown included, then leave the imported objects alone (0.6 s
    # of CPU per run at fairseq's imports, measured, where a fresh process pays it once)
    gc.collect()
    gc.freeze()
    requests, answers = os.fdopen(request_fd, "r"), os.fdopen(answer_fd, "w")
    answers.write('{"ready": true}\n')
    answers.flush()
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, (requests, answers))
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


# ---- the client (in the test process) -----------------------------------------------------------------------------

class _Server:
    def __init__(self, entry, env, cwd, seed):
        req_r, self._req_w = os.pipe()
        self._ans_r, ans_w = os.pipe()
        code = ("import sys; sys.path.insert(0, %r); import forked_cli; forked_cli.serve(%d, %d, %r, %r)"
                % (os.path.dirname(os.path.abspath(__file__)), req_r, ans_w, *entry))
        self.entry, self.seed = entry, seed
        self.proc = subprocess.Popen([sys.executable, "-c", code], env=dict(env, PYTHONHASHSEED=str(seed)), cwd=cwd,
                                     pass_fds=(req_r, ans_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        os.close(req_r), os.close(ans_w)
        self._requests, self._answers = os.fdopen(self._req_w, "w"), os.fdopen(self._ans_r, "r")
        self.env = _import_relevant(env)
        self.lock = threading.Lock()
        hello = json.loads(self._answers.readline() or '{"error": "the server exited"}')
        self.ready = hello.get("ready", False)

    def run(self, cmd, env, cwd, input):
        with self.lock, tempfile.TemporaryDirectory(prefix="forked-cli-") as tmp:
            paths = {k: os.path.join(tmp, k) for k in ("stdin", "stdout", "stderr")}
            for k, p in paths.items():
                with open(p, "w", encoding="utf-8") as f:
                    f.write(input if k == "stdin" and input is not None else "")
            args = cmd[1:] if self.entry[0] == "script" else cmd[3:]  # after "python -m MODULE"
            self._requests.write(json.dumps(dict(entry=self.entry, argv0=cmd[0], args=list(args), env=env, cwd=cwd,
                                                 **paths)) + "\n")
            self._requests.flush()
            answer = self._answers.readline()
            if not answer:
                raise RuntimeError("the forked-CLI server died")
            out = [open(paths[k], encoding="utf-8", errors="replace").read() for k in ("stdout", "stderr")]
            done = subprocess.CompletedProcess(list(cmd), json.loads(answer)["returncode"], *out)
            done.hash_seed = self.seed
            return done

    def usable(self, env):
        return self.ready and self.proc.poll() is None and _import_relevant(env) == self.env


SERVERS_PER_TOOL = 2
_servers = {}  # entry -> [_Server, ...] (up to SERVERS_PER_TOOL, each with its own hash seed)
_runs = {}  # entry -> forked runs so far (which server is next)
# set by pytest per test, read by nobody at import time
_NOT_READ_AT_IMPORT = ("PYTEST_CURRENT_TEST",)


def _import_relevant(env):
    return {k: v for k, v in env.items() if k not in _NOT_READ_AT_IMPORT}


def _hash_seeds(env, taken):
    """The hash seed of a tool's next server: the caller's PYTHONHASHSEED if it sets one, else a random one that
    its other servers do not have (1 .. 2**32 - 1, as Python draws it; 0 would switch hashing's randomness off)."""
    if "PYTHONHASHSEED" in env:
        return env["PYTHONHASHSEED"]
    while True:
        seed = random.SystemRandom().randrange(1, 2 ** 32)
        if seed not in taken:
            return seed


def run(cmd, env, cwd, input=None):
    """subprocess.run(cmd, env=env, cwd=cwd, input=input, capture_output=True, text=True), forked from one of the
    tool's servers when ``cmd`` is a known entry point of this interpreter (started again in ``env`` where theirs
    differs); else a real process. Consecutive forked runs of a tool alternate between its servers (their hash
    seeds differ)."""
    entry = entry_point(cmd, sys.executable)
    if entry and "--compile" not in cmd and os.environ.get("UMST_TEST_FRESH_PROCESSES") != "1":
        if _servers.get(entry) and _import_relevant(env) != _servers[entry][0].env:
            # a server keeps the environment it started in: start the tool's again in this one (the imports cost
            # what a real process's would, and the next runs in it fork)
            stop(entry)
        servers = _servers.setdefault(entry, [])
        turn = _runs.get(entry, 0) % (1 if "PYTHONHASHSEED" in env else SERVERS_PER_TOOL)
        if turn == len(servers):
            servers.append(_Server(entry, env, cwd, _hash_seeds(env, [s.seed for s in servers])))
        server = servers[min(turn, len(servers) - 1)]
        if server.usable(env):
            _runs[entry] = _runs.get(entry, 0) + 1
            return server.run(cmd, env, cwd, input)
    return subprocess.run(cmd, env=env, input=input, capture_output=True, text=True, cwd=cwd)


def stop(entry):
    """End ``entry``'s servers (a test that served a module of its own); the next run of it starts new ones."""
    for server in _servers.pop(entry, []):
        server._requests.close()  # the server's loop ends at the end of its requests
        server.proc.wait(timeout=60)
        server._answers.close()
    _runs.pop(entry, None)
