"""The GPU check: everything a lent GPU should run, in two calls (a plain one, then ``--only compile``), from the
project's own files.

Run by ``scripts/gpu-check.sh``. The machine has a Python with torch (CUDA) and no internet; the checkout
carries a wheelhouse (``scripts/offline-wheelhouse.sh``: fairseq-fixed's source archive and wheels of what
the machine lacks). It asks the machine's torch for the CUDA device first (the report is named after it; no
CUDA device, no check). Steps (``STEPS``), each with a time budget (its timeout) printed as it starts and ends:

  install      wheels -> ``<work>/site`` (``pip --no-index --no-deps --target``); fairseq-fixed's sdist
               unpacked and its three light extensions compiled in place (``fairseq_source``)
  env          Python, torch, CUDA, the device, fairseq, the plugin's archs registered
  data, tests, compile-tests, op-counts   at the same time (none of them times anything):
               ``python -m benchmarks synthetic-corpus`` (29,000 random pairs of Multi30k lengths, binarized, side
               files);
               the tests marked ``cuda`` (the model checks on the GPU, fp32/fp16/bf16; then, a step of its own,
               TranSFormer's and Prime's layers compiled, failing on any fallback to eager); ``benchmarks op-counts``
               (fp32-only backward matmuls under bf16, host syncs per step)
  bench        ``benchmarks archs --profile``, bf16, eager, 4,096 and 16,384 tokens: time, kernels and GPU busy per
               training step against the transformer
  train-speed  ``benchmarks train``: fairseq-train words/s on the synthetic corpus, every arch in fp32 and bf16
               ``--amp``, stock fairseq's transformer in fp32 and fp16 ``--amp``; umst_base trains 200 updates in
               each, and its bf16 loss must follow fp32's within 2% (the mean over the last 50 updates)
  decode       ``benchmarks decode``: fairseq-generate at beam 1 and 5 per arch; kernels per decoding step
  launches     ``benchmarks launches --device cuda``: the kernels of one whole fairseq update by phase
  compile      ``--compile``, the second call: benchmarks launches (the compiled update's kernels: TranSFormer,
               Prime and a transformer of each one's shape, with any layer that fell back to eager named), then
               for a subset (``COMPILE_ARCHS``) benchmarks archs and
               benchmarks train, compile time apart; umst_base compiled trains to the eager loss within 1% over
               200 updates

A step that fails or runs out of time is recorded and the next one runs (steps that need fairseq are skipped
if the install failed); ``--deadline`` cuts the last step short and skips what has no time left, and
``--only a,b`` runs those steps (a second call finishes what a first one had no time for). Results,
rewritten after every step (a call killed at its limit keeps what was measured): ``<out>/gpu-<device>.json``
(every step, the tables' numbers, the test summary from pytest's JUnit XML), ``<out>/gpu-<device>.md`` (the
tables each benchmark wrote) and ``<out>/gpu-check-log.txt`` (each step's output).

``--dry-run`` runs on any machine, without a GPU: it prints the plan, builds the wheelhouse if none is
given (for this machine's Python, everything but torch: ``offline-wheelhouse.sh --full``), creates a fresh
venv that sees only torch (and what torch needs) from this Python, installs into it from the wheelhouse with
``--no-index``, builds fairseq the same light way, and checks inside it that every command of the plan parses
(the pytest selection collects, the fairseq and plugin command lines parse with their own parsers).
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(ROOT, "umst_plugin")
LOSS_UPDATES = 200  # umst_base's fp32 / bf16 / --compile rows of the words/s runs train this long: same loss?
LOSS_TOLERANCE = 0.02  # bf16 --amp against fp32, mean loss of the last 50 updates both reached
COMPILE_LOSS_TOLERANCE = 0.01  # --compile against eager (both bf16), same seed
COMPILE_ARCHS = "transformer,umst"  # the --compile subset of one check (compiling every arch does not fit)
# launches --compile --floor: the archs whose compiled launch rate has a target (at most stock's eager per FLOP, or
# within 10% of a transformer of their own shape: docs/compile.md), then their floors; rows are kept as they are
# counted. The benchmark reads them from the family registry ("floored": each family's own row that has a floor of
# its shape). (The transformer's and UMST's compiled updates were counted on two H200s, the same both times.)
COMPILE_LAUNCH_ARCHS = "floored"

# name, budget in seconds (the step's timeout), what it is for. The GPU's correctness first (install, the CUDA
# tests), then the measurements by priority; a deadline cuts what has no time left (--only runs the rest).
STEPS = [
    ("install", 40, "wheels into <work>/site; fairseq-fixed's sdist unpacked, its light extensions compiled"),
    ("env", 20, "Python, torch, CUDA, device, fairseq; the plugin's archs register"),
    ("data", 40, "the synthetic corpus of Multi30k lengths (29,000 pairs), fairseq-preprocess, umst-preprocess"),
    ("tests", 120, "pytest -m cuda: the model checks, the stock --amp fp16 resume cells and --compile-cudagraphs' "
              "losses on the GPU, with and without its shape cap (runs beside data, compile-tests and op-counts)"),
    ("compile-tests", 110, "pytest -m cuda tests/test_compile.py: the families' layers compiled on the GPU "
                           "at tiny widths, fp32 and bf16, with no fallback to eager (beside data, tests and op-counts)"),
    # 60: the whole-update sync counts (two fairseq Trainers per arch) took op-counts from 21 to 43 s on a 2-core
    # CPU; the group's time is its longest budget (tests), so this adds nothing to a call
    ("op-counts", 60, "benchmarks op-counts on CUDA: fp32-only backward matmuls under bf16, host syncs per step "
                      "and per whole update (beside data, tests and compile-tests)"),
    ("bench", 80, "benchmarks archs, bf16 autocast, eager, 4,096 and 16,384 tokens: time, kernels and GPU busy "
                  "per step against the transformer"),
    ("train-speed", 125, f"benchmarks train: fairseq-train words/s, every arch in fp32 and bf16 --amp, stock fairseq's "
                         f"transformer in fp32 and fp16 --amp; umst_base {LOSS_UPDATES} updates (fp32 vs bf16 loss)"),
    ("decode", 55, "benchmarks decode: fairseq-generate at beam 1 and 5 per arch (300 sentences, best of 2), "
                   "sentences/s; kernels per decoding step; a paper's batch-size-1 decoding claim (30 sentences)"),
    ("launches", 40, "benchmarks launches --device cuda: kernels of one whole fairseq update by phase, stock and plugin"),
    ("compile", 300, f"--compile: benchmarks launches --compile --floor for the archs with a floor of their "
                     f"shape (--archs {COMPILE_LAUNCH_ARCHS}): the kernels of a compiled update, against a transformer "
                     f"of each one's shape; for {COMPILE_ARCHS}: benchmarks archs at 4,096 tokens, fairseq-train words/s and "
                     f"umst_base's loss over {LOSS_UPDATES} updates against eager, benchmarks archs at 16,384 tokens"),
]
# steps that run at the same time (none of them times anything)
CONCURRENT = [("data", "tests", "compile-tests", "op-counts")]
# what a plain call runs (by its budgets, at most 470 s); the rest is a second call, --only compile, whose results
# join the first's report
SECOND_CALL = ("compile",)
NEEDS_FAIRSEQ = {name for name, _, _ in STEPS} - {"install"}
NEEDS = {"train-speed": "data", "decode": "data", "compile": "data"}
MIN_STEP_SECONDS = 15  # a step that would get less time before the deadline is skipped


def commands(py, work, out):
    """Step name -> list of argv lists (run in order, in the repo root)."""
    synth = os.path.join(work, "synthetic")
    databin = os.path.join(synth, "data-bin")

    def bench(what):
        return [py, "-m", "benchmarks", what]

    def archs_bench(tokens, stem, compiled=False):
        """benchmarks archs, bf16, one batch size: every arch eager (the "bench" step), or COMPILE_ARCHS compiled
        (the "compile" step: a warm-up more, where the first step compiles; memory left to the eager rows)."""
        extra = ["--no-memory", "--archs", COMPILE_ARCHS, "--compile"] if compiled else (
            ["--no-memory"] if tokens > 4096 else [])
        return bench("archs") + ["--device", "cuda", "--precisions", "bf16", "--max-tokens", str(tokens),
                                          "--repeats", "4", "--warmup", "2" if compiled else "1", "--profile"] + extra + [
            "--json", os.path.join(work, f"{stem}.json"), "--markdown", os.path.join(work, f"{stem}.md")]
    return {
        "env": [[py, "-m", "benchmarks.gpu_check", "--report-env"]],
        "data": [bench("synthetic-corpus") + [synth, "--workers", "8"]],
        "tests": [[py, "-m", "pytest", "-m", "cuda", "-q", "-n", "12", "-p", "no:cacheprovider",
                   "--junitxml", os.path.join(work, "gpu-tests.xml"), "tests/test_model_checks.py",
                   # stock fairseq's --amp fp16 resume cells: CUDA autocast and grad scaler, nothing on a CPU
                   "tests/test_resume_matrix.py",
                   # --compile-cudagraphs: the compiled losses replayed as CUDA graphs, no graph skipped, capped
                   "tests/test_compile_cudagraphs.py",
                   # the stop flag's copy to pinned host memory, without a sync
                   "tests/test_preemption.py"]],
        # a step of its own: the model checks' results stand if compiling runs out of time, and a failing model
        # check does not stop the compiled layers' test (a step's commands stop at the first that fails)
        # one worker per arch compiled (tests/test_compile.py, CUDA_ARCHS): they compile at the same time
        "compile-tests": [[py, "-m", "pytest", "-m", "cuda", "-q", "-n", "3", "-p", "no:cacheprovider",
                           "--junitxml", os.path.join(work, "gpu-compile-tests.xml"), "tests/test_compile.py"]],
        "op-counts": [bench("op-counts") + ["--device", "cuda", "--json", os.path.join(work, "op-counts.json"),
                                                     "--markdown", os.path.join(work, "op-counts.md")]],
        "bench": [archs_bench(tokens, f"bench-{tokens}") for tokens in (4096, 16384)],
        "train-speed": [bench("train") + ["--data", databin, "--updates", "40", "--loss-archs", "umst",
                                                   "--loss-updates", str(LOSS_UPDATES), "--deadline", "115",
                                                   "--work", os.path.join(work, "train-speed"),
                                                   "--json", os.path.join(work, "train-speed.json"),
                                                   "--markdown", os.path.join(work, "train-speed.md")]],
        "decode": [bench("decode") + ["--device", "cuda", "--data", databin, "--sentences", "300",
                                               "--claim-sentences", "30", "--repeats", "2",
                                               "--json", os.path.join(work, "decode.json"),
                                               "--markdown", os.path.join(work, "decode.md")]],
        "launches": [bench("launches") + ["--device", "cuda", "--precision", "bf16",
                                                   "--json", os.path.join(work, "launches.json"),
                                                   "--markdown", os.path.join(work, "launches.md")]],
        # by priority (a step cut short at its budget keeps what its first commands wrote): the compiled update's
        # kernels of TranSFormer and Prime and of a transformer of each one's shape (on an H200 four rows took 229 s
        # of the 300), the bench at 4,096 tokens (measured on two H200s), fairseq-train words/s and the loss
        # against eager, the bench at 16,384
        "compile": [bench("launches") + ["--device", "cuda", "--precision", "bf16", "--compile",
                                                  "--archs", COMPILE_LAUNCH_ARCHS, "--floor",
                                                  "--json", os.path.join(work, "compile-launches.json"),
                                                  "--markdown", os.path.join(work, "compile-launches.md")],
                    archs_bench(4096, "compile-bench", compiled=True),
                    bench("train") + ["--data", databin, "--archs", "", "--compile-archs", COMPILE_ARCHS,
                                               "--no-stock", "--updates", "40", "--loss-archs", "umst",
                                               "--loss-updates", str(LOSS_UPDATES), "--timeout", "100",
                                               "--work", os.path.join(work, "train-compile"),
                                               "--json", os.path.join(work, "train-compile.json"),
                                               "--markdown", os.path.join(work, "train-compile.md")],
                    archs_bench(16384, "compile-bench-16384", compiled=True)],
    }


def step_env(site, fairseq_tree):
    paths = [p for p in (site, fairseq_tree, ROOT) if p]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "4")
    return env


def wheel_files(wheelhouse):
    """The wheelhouse's wheels to install (not this plugin's own wheel: the checkout is used)."""
    return sorted(os.path.join(wheelhouse, f) for f in os.listdir(wheelhouse)
                  if f.endswith(".whl") and not f.startswith("umst_plugin-"))


def install(py, wheelhouse, work, log):
    from umst_dev import fairseq_source

    site = os.path.join(work, "site")
    wheels = wheel_files(wheelhouse)
    stamp = os.path.join(work, "install-done.json")
    record = dict(python=py, wheels=[os.path.basename(w) for w in wheels])
    if os.path.exists(stamp):  # a later call on the same machine (--only): the same wheels are in place
        with open(stamp) as f:
            done = json.load(f)
        if done.get("record") == record and os.path.isdir(done.get("tree", "")):
            log.write(f"already installed in {work} by an earlier call (same Python, same wheels)\n")
            return site, done["tree"]
    if wheels:
        cmd = [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
               "--disable-pip-version-check", "--upgrade", "--target", site] + wheels
        log.write("$ " + shlex.join(cmd[:cmd.index("--target") + 2]) + f" <{len(wheels)} wheels of {wheelhouse}>\n")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"pip install from {wheelhouse} failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
    tree = fairseq_source.build_light(wheelhouse, os.path.join(work, "fairseq-src"), python=py, log=log,
                                      env=step_env(site, None))
    with open(stamp, "w") as f:
        json.dump(dict(record=record, tree=tree), f)
    return site, tree


def report_env():
    """The env step (run inside the step's environment)."""
    import torch

    info = dict(python=sys.version.split()[0], torch=torch.__version__, cuda=torch.version.cuda,
                cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=torch.cuda.get_device_name(0), memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count, capability=f"{props.major}.{props.minor}",
                    bf16_supported=torch.cuda.is_bf16_supported())
    import fairseq
    import umst_plugin  # noqa: F401  (registers the archs)
    from fairseq.models import ARCH_MODEL_REGISTRY

    info.update(fairseq=fairseq.__version__, fairseq_path=os.path.dirname(fairseq.__file__),
                archs=sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m.__module__.startswith("umst_plugin")))
    print("GPUCHECK-ENV " + json.dumps(info))
    return 0


def slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def train_losses(text):
    """(update, loss) pairs from fairseq-train's json train_inner lines."""
    points = []
    for line in text.splitlines():
        i = line.find("{")
        if i < 0 or "train_inner" not in line[:i + 1] and '"num_updates"' not in line:
            continue
        try:
            record = json.loads(line[i:])
        except ValueError:
            continue
        if "loss" in record and "num_updates" in record and "train_loss" not in record:
            points.append((int(record["num_updates"]), float(record["loss"])))
    return points


def tail_mean(points, last=50):
    top = max(u for u, _ in points)
    kept = [loss for u, loss in points if u > top - last]
    return sum(kept) / len(kept)


def pytest_summary(text):
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", text)}
    return counts


def junit_summary(path):
    """passed / failed / skipped / errors from pytest's JUnit XML (what the run wrote, whatever it printed)."""
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts = {"passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
              "failed": total["failures"], "errors": total["errors"], "skipped": total["skipped"]}
    return {k: v for k, v in counts.items() if v or k == "passed"}


def probe_device(py):
    """The CUDA device's name, asked of ``py``'s torch before anything else (the report files are named after
    it), or None when that torch sees no CUDA device."""
    proc = subprocess.run([py, "-c", "import torch; print(torch.cuda.get_device_name(0) if "
                           "torch.cuda.is_available() else '')"], capture_output=True, text=True)
    name = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else ""
    return name or None


def start_result(out, device, py, only_names=None):
    """The report this call fills: a new one, or with ``--only`` (``only_names``) the device's last report, whose
    entries of these steps are replaced (a second call completes a first)."""
    now = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    previous = os.path.join(out, f"gpu-{slug(device)}.json")
    if only_names and os.path.exists(previous):
        with open(previous) as f:
            result = json.load(f)
        result["steps"] = [s for s in result["steps"] if s["name"] not in only_names]
        result.setdefault("calls", []).append(dict(started=now, only=list(only_names)))
        return result
    return dict(started=now, host_python=py, device=device, steps=[])


def needed_ready(need, status, group, names, work):
    """Whether what a step needs is there: the needed step ran fine in this call (or runs beside it), or -- not
    in this call's plan -- an earlier call on this machine left its output (the synthetic data-bin)."""
    if need in group:
        return True
    if need in names:
        return status.get(need) == "ok"
    return need == "data" and os.path.exists(os.path.join(work, "synthetic", "data-bin", "dict.src.txt"))


def plan_wall_seconds(only=None):
    """The longest a call can take by its steps' budgets (concurrent steps count once, by the longest)."""
    budgets = {name: budget for name, budget, _ in STEPS}
    names = [n for n, _, _ in STEPS if (n in only or n == "install" if only else n not in SECOND_CALL)]
    return sum(max(budgets[n] for n in group) for group in stages(names))


def run_process_group(argv, env, timeout):
    """``subprocess.run(argv, capture_output=True, timeout=...)`` in a session of its own, where a timeout kills
    the whole process group, not just ``argv``'s process: a benchmark's children (bench_train's fairseq-train
    process, data loader workers) must not go on using the GPU through the next steps."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def run_step(name, budget, argv_list, env, t0):
    """Run a step's commands in order within ``budget`` seconds: (status, output, log text)."""
    output, log = "", ""
    try:
        rc = 0
        for argv in argv_list:
            remaining = budget - (time.time() - t0)
            log += "$ " + shlex.join(argv) + "\n"
            proc = run_process_group(argv, env, max(remaining, 1))
            output += proc.stdout + proc.stderr
            log += proc.stdout[-20000:] + proc.stderr[-20000:]
            rc = proc.returncode
            if rc != 0:
                break
        return ("ok" if rc == 0 else f"failed (rc {rc})"), output, log
    except subprocess.TimeoutExpired as e:
        for stream in (e.stdout, e.stderr):
            text = stream.decode(errors="replace") if isinstance(stream, bytes) else (stream or "")
            output += text
            log += text[-20000:]
        return f"timed out after {budget} s", output, log
    except Exception as e:  # noqa: BLE001  (a failed step is recorded; the check goes on)
        status = f"failed: {type(e).__name__}: {str(e)[:500]}"
        return status, output, log + status + "\n"


def stages(names):
    """The steps to run, in order, grouped where they run at the same time (``CONCURRENT``)."""
    out, done = [], set()
    for name in names:
        if name in done:
            continue
        group = next((g for g in CONCURRENT if name in g), (name,))
        members = [n for n in group if n in names]
        done.update(members)
        out.append(members)
    return out


def run_plan(py, wheelhouse, work, out, deadline, only=None):
    device = probe_device(py)
    if device is None:
        print(f"[gpu-check] {py}'s torch sees no CUDA device: the check needs a GPU (--dry-run checks the plan "
              "on any machine)", file=sys.stderr)
        return 2
    os.makedirs(work, exist_ok=True)
    os.makedirs(out, exist_ok=True)
    log_path = os.path.join(out, "gpu-check-log.txt")
    names = [name for name, _, _ in STEPS if (name in only if only else name not in SECOND_CALL)]
    start = time.time()
    result = start_result(out, device, py, names if only else None)
    log = open(log_path, "a" if only else "w")
    site = tree = None
    status = {}
    cmds = commands(py, work, out)
    budgets = {name: (budget, what) for name, budget, what in STEPS}
    for group in stages(names):
        elapsed = time.time() - start
        runnable = []
        for name in group:
            budget, what = budgets[name]
            entry = dict(name=name, budget_s=budget, what=what)
            result["steps"].append(entry)
            if name in NEEDS_FAIRSEQ and status.get("install") != "ok":
                entry["status"] = "skipped (install failed)"
            elif NEEDS.get(name) and not needed_ready(NEEDS[name], status, group, names, work):
                entry["status"] = f"skipped ({NEEDS[name]} failed or not run)"
            elif deadline - elapsed < MIN_STEP_SECONDS:
                entry["status"] = f"skipped (only {deadline - elapsed:.0f} s left before the {deadline} s deadline)"
            if "status" in entry:
                status[name] = "skipped"
                print(f"[gpu-check] {name}: {entry['status']}", flush=True)
                continue
            entry["budget_s"] = min(budget, int(deadline - elapsed))  # the deadline cuts the last step short
            runnable.append(entry)
            print(f"[gpu-check] {name} (budget {entry['budget_s']} s, at {elapsed:.0f} s): {what}", flush=True)
        t0 = time.time()
        if [e["name"] for e in runnable] == ["install"]:
            entry = runnable[0]
            log.write(f"\n===== install (budget {entry['budget_s']} s)\n")
            try:
                site, tree = install(py, wheelhouse, work, log)
                entry["status"] = "ok"
            except Exception as e:  # noqa: BLE001
                entry["status"] = f"failed: {type(e).__name__}: {str(e)[:500]}"
                log.write(entry["status"] + "\n")
            outputs = {"install": ""}
            entry["seconds"] = round(time.time() - t0, 1)
        else:
            import concurrent.futures

            with concurrent.futures.ThreadPoolExecutor(max_workers=max(len(runnable), 1)) as pool:
                futures = {e["name"]: pool.submit(run_step, e["name"], e["budget_s"], cmds[e["name"]],
                                                  step_env(site, tree), t0) for e in runnable}
                outputs = {}
                for entry in runnable:
                    entry["status"], outputs[entry["name"]], text = futures[entry["name"]].result()
                    entry["seconds"] = round(time.time() - t0, 1) if len(runnable) == 1 else None
                    log.write(f"\n===== {entry['name']} (budget {entry['budget_s']} s)\n{text}")
            if len(runnable) > 1:  # the group's wall time (each step's own end is not tracked)
                for entry in runnable:
                    entry["seconds"] = round(time.time() - t0, 1)
                    entry["concurrent_with"] = [e["name"] for e in runnable if e is not entry]
        for entry in runnable:
            status[entry["name"]] = "ok" if entry["status"] == "ok" else "failed"
            collect(entry["name"], entry, outputs.get(entry["name"], ""), work, result)
            print(f"[gpu-check] {entry['name']}: {entry['status']} in {entry['seconds']} s "
                  f"(budget {entry['budget_s']} s)", flush=True)
        log.flush()
        write_results(result, out, start)  # after every step: a run cut short keeps what it measured
    base = write_results(result, out, start)
    log.close()
    print(markdown(result))
    print(f"[gpu-check] wrote {base}.json, {base}.md, {log_path} ({result['total_seconds']} s)")
    return 0 if all(s["status"] == "ok" for s in result["steps"]) else 1


def mean_loss_over(points, updates):
    kept = [loss for u, loss in points if u in updates]
    return sum(kept) / len(kept)


def compare_losses(a_points, b_points, last=50):
    """Two runs' mean logged training loss over the last ``last`` updates both reached (a run cut short is
    compared where it stopped): (first, final update, mean a, mean b, relative difference)."""
    a, b = dict(map(tuple, a_points)), dict(map(tuple, b_points))
    common = sorted(set(a) & set(b))
    if not common:
        return None
    kept = {u for u in common if u > common[-1] - last}
    mean_a, mean_b = mean_loss_over(a_points, kept), mean_loss_over(b_points, kept)
    return dict(updates=[min(kept), max(kept)], a=mean_a, b=mean_b, rel_diff=abs(mean_b - mean_a) / mean_a)


def train_rows(result, key):
    return {(r["name"], r["precision"]): r for r in result.get(key, {}).get("rows", []) if r.get("loss")}


def compare_training(result):
    """umst_base: bf16 --amp against fp32 (within 2%), and --compile against eager in bf16 (within 1%), on the
    same updates of the words/s runs."""
    speed, compiled = train_rows(result, "train-speed"), train_rows(result, "compile")
    fp32, bf16 = speed.get(("umst", "fp32")), speed.get(("umst", "bf16"))
    if fp32 and bf16:
        c = compare_losses(fp32["loss"], bf16["loss"])
        if c:
            result["train_compared_updates"] = c["updates"]
            result["train_loss_fp32"], result["train_loss_bf16"] = c["a"], c["b"]
            result["train_loss_rel_diff"] = c["rel_diff"]
            result["train_loss_within_2pct"] = c["rel_diff"] <= LOSS_TOLERANCE
    comp = compiled.get(("umst_compile", "bf16"))
    if bf16 and comp:
        c = compare_losses(bf16["loss"], comp["loss"])
        if c:
            result["compile_compared_updates"] = c["updates"]
            result["compile_loss_eager"], result["compile_loss_compiled"] = c["a"], c["b"]
            result["compile_loss_rel_diff"] = c["rel_diff"]
            result["compile_loss_within_1pct"] = c["rel_diff"] <= COMPILE_LOSS_TOLERANCE


def write_results(result, out, start):
    """Write ``gpu-<device>.json`` and ``.md`` (only ever for the device the check runs on)."""
    if "calls" in result:
        result["calls"][-1]["seconds"] = round(time.time() - start, 1)
    else:
        result["total_seconds"] = round(time.time() - start, 1)
    compare_training(result)
    base = os.path.join(out, f"gpu-{slug(result['device'])}")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(result))
    return base


# step -> (the JSON files it writes into <work>, the markdown tables it writes beside them)
STEP_FILES = {"op-counts": ["op-counts"], "bench": ["bench-4096", "bench-16384"], "train-speed": ["train-speed"],
              "decode": ["decode"], "launches": ["launches"], "compile": ["compile-bench", "train-compile", "compile-bench-16384", "compile-launches"]}


def collect(name, entry, output, work, result):
    """Pull the step's numbers out of its output and files into ``result``."""
    if name == "env":
        m = re.search(r"^GPUCHECK-ENV (\{.*\})$", output, flags=re.M)
        if m:
            result["env"] = json.loads(m.group(1))
    elif name in ("tests", "compile-tests"):
        xml = os.path.join(work, "gpu-tests.xml" if name == "tests" else "gpu-compile-tests.xml")
        if os.path.exists(xml):
            entry["summary"] = junit_summary(xml)
        else:  # the run died before writing it: the last summary line pytest printed
            lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|errors?)", line)]
            entry["summary"] = pytest_summary(lines[-1] if lines else "")
        entry["failures"] = re.findall(r"^FAILED (\S+)", output, flags=re.M)[:40]
        # pytest's short summary, "FAILED id - message": a failure's first line is often its diagnosis (a compiled
        # layer's fallback names its error), and the report is read where the log is not
        entry["failure_messages"] = [f"{t} - {m[:400]}" for t, m in
                                     re.findall(r"^FAILED (\S+) - (.*)$", output, flags=re.M)[:40]]
    for stem in STEP_FILES.get(name, []):
        path = os.path.join(work, f"{stem}.json")
        if os.path.exists(path):
            with open(path) as f:
                data = json.load(f)
            key = name if len(STEP_FILES[name]) == 1 else stem
            if name == "compile" and stem == "train-compile":
                key = "compile"
            result[key] = data
            table = os.path.join(work, f"{stem}.md")
            if os.path.exists(table):
                with open(table) as f:
                    result.setdefault("tables", {})[stem] = f.read().strip()


TABLE_TITLES = [
    ("bench-4096", "One training step against the transformer, bf16, 4,096 tokens (benchmarks archs)"),
    ("bench-16384", "One training step against the transformer, bf16, 16,384 tokens (benchmarks archs)"),
    ("launches", "Kernels of one whole fairseq update by phase, bf16 --amp (benchmarks launches)"),
    ("train-speed", "fairseq-train words/s on the synthetic corpus (benchmarks train)"),
    ("compile-bench", f"--compile ({COMPILE_ARCHS}): one training step, bf16, 4,096 tokens (benchmarks archs)"),
    ("compile-bench-16384", f"--compile ({COMPILE_ARCHS}): one training step, bf16, 16,384 tokens (benchmarks archs)"),
    ("train-compile", f"--compile ({COMPILE_ARCHS}): fairseq-train words/s (benchmarks train)"),
    ("compile-launches", "--compile (the archs with a floor of their shape): kernels of one whole compiled update, bf16 --amp, the CPU-side "
                         "count beside the profiler's (benchmarks launches)"),
    ("decode", "Decoding: fairseq-generate at beam 1 and 5 (benchmarks decode)"),
    ("op-counts", "Matmuls and host syncs on CUDA (benchmarks op-counts)"),
]


def markdown(result):
    env = result.get("env", {})
    lines = [f"# GPU check: {env.get('device', result.get('device', '?'))}", "",
             f"torch {env.get('torch', '?')} (CUDA {env.get('cuda', '?')}), Python {env.get('python', '?')}, "
             f"fairseq {env.get('fairseq', '?')}; started {result['started']}, {result.get('total_seconds', '?')} s "
             "in all (`bash scripts/gpu-check.sh`).", "",
             "| step | status | seconds | budget |", "|---|---|---|---|"]
    for s in result["steps"]:
        extra = ""
        if s.get("summary"):
            extra = " (" + ", ".join(f"{v} {k}" for k, v in s["summary"].items()) + ")"
        if s.get("concurrent_with"):
            extra += " (beside " + ", ".join(s["concurrent_with"]) + ")"
        lines.append(f"| {s['name']} | {s['status']}{extra} | {s.get('seconds', '')} | {s['budget_s']} |")
    failures = [f for s in result["steps"] for f in s.get("failures", [])]
    if failures:
        lines += ["", "Failed tests: " + ", ".join(f"`{f}`" for f in failures)]
        messages = [m for s in result["steps"] for m in s.get("failure_messages", [])]
        if messages:
            lines += [""] + [f"* {m}" for m in messages]
    tables = result.get("tables", {})
    for stem, title in TABLE_TITLES:
        if stem in tables:
            lines += ["", f"## {title}", "", tables[stem]]
    if "train_loss_rel_diff" in result:
        first, final = result["train_compared_updates"]
        lines += ["", f"umst_base, bf16 `--amp` against fp32, mean training loss over updates {first}-{final}: "
                      f"{result['train_loss_bf16']:.4f} against {result['train_loss_fp32']:.4f}, "
                      f"{100 * result['train_loss_rel_diff']:.2f}% apart "
                      f"({'within' if result['train_loss_within_2pct'] else 'NOT within'} 2%)."]
    if "compile_loss_rel_diff" in result:
        first, final = result["compile_compared_updates"]
        lines += ["", f"umst_base, `--compile` against eager (bf16 `--amp`, same seed), mean training loss over "
                      f"updates {first}-{final}: {result['compile_loss_compiled']:.4f} against "
                      f"{result['compile_loss_eager']:.4f}, {100 * result['compile_loss_rel_diff']:.2f}% apart "
                      f"({'within' if result['compile_loss_within_1pct'] else 'NOT within'} 1%)."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ dry run

def check_commands(cmds_json):
    """Inside the fresh environment: every command of the plan parses with its program's own parser."""
    with open(cmds_json) as f:
        cmds = json.load(f)
    failures = []
    for name, argv_list in cmds.items():
        for argv in argv_list:
            try:
                check_one(argv)
                print(f"[dry-run] parses: {name}: {shlex.join(argv[1:4])} ...", flush=True)
            except SystemExit as e:
                failures.append(f"{name}: {shlex.join(argv)}: exit {e.code}")
            except Exception as e:  # noqa: BLE001
                failures.append(f"{name}: {shlex.join(argv)}: {type(e).__name__}: {e}")
    for f in failures:
        print(f"[dry-run] DOES NOT PARSE: {f}", file=sys.stderr)
    return 1 if failures else 0


DRY_RUN_BENCHMARKS = ("archs", "train", "launches", "decode")  # each checks its own arguments with --dry-run


def check_one(argv):
    args = argv[1:]
    if args[:2] == ["-m", "benchmarks.gpu_check"]:
        parser().parse_args(args[2:])
    elif args[:2] == ["-m", "pytest"]:
        selection, rest = [], iter(args[2:])
        for a in rest:
            if a in ("-n", "--junitxml"):  # workers and the report file: nothing to collect
                next(rest)
            else:
                selection.append(a)
        proc = subprocess.run([argv[0], "-m", "pytest", "--collect-only", "-q"] + selection, cwd=ROOT,
                              capture_output=True, text=True)
        counts = [int(n) for n in re.findall(r"^\S+\.py: (\d+)$", proc.stdout, flags=re.M)]
        if proc.returncode != 0 or not sum(counts):
            raise RuntimeError(f"pytest --collect-only failed (rc {proc.returncode}): {proc.stdout[-1500:]}"
                               f"{proc.stderr[-1500:]}")
    elif args[:2] == ["-m", "benchmarks"] and args[2] in DRY_RUN_BENCHMARKS:  # its names checked, nothing measured
        rc, out = run_benchmark(args[2:] + ["--dry-run"])
        if rc != 0:
            raise RuntimeError(out[-3000:])
    elif args[:2] == ["-m", "benchmarks"]:  # every flag used is one it has
        rc, out = run_benchmark(args[2:3] + ["--help"])
        used = [a for a in args[3:] if a.startswith("--")]
        missing = [a for a in used if a not in out]
        if rc != 0 or missing:
            raise RuntimeError(f"benchmarks {args[2]} --help failed or lacks {missing}: {out[-1500:]}")
    else:
        raise RuntimeError(f"no parse check known for {argv}")


def run_benchmark(args):
    """(exit status, stdout + stderr) of ``python -m benchmarks args...``, run in this process (its dispatcher's
    ``main``; sys.argv restored): the benchmarks share one import of torch and fairseq instead of paying it each
    (seconds per benchmark)."""
    import contextlib
    import io

    from benchmarks.__main__ import main

    out, argv = io.StringIO(), sys.argv
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            rc = main(list(args))
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
    return rc, out.getvalue()


def torch_closure(python):
    """Top-level import names of torch and of every distribution torch requires (recursively), as seen by
    ``python``: what a fresh venv borrows to stand for the GPU machine's own torch."""
    code = r'''
import importlib.metadata as md, json, re
seen, todo, names = set(), ["torch"], set()
while todo:
    dist = todo.pop()
    key = re.sub(r"[-_.]+", "-", dist).lower()
    if key in seen:
        continue
    seen.add(key)
    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        continue
    top = (d.read_text("top_level.txt") or "").split()
    if not top:
        top = sorted({f.parts[0].removesuffix(".py") for f in (d.files or [])
                      if not f.parts[0].endswith((".dist-info", ".data")) and f.parts[0] not in ("..", "bin")})
    names.update(t for t in top if t)
    for req in d.requires or []:
        if "extra ==" in req:
            continue
        todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
import site, torch, os
print(json.dumps({"site": os.path.dirname(os.path.dirname(torch.__file__)), "names": sorted(names)}))
'''
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fresh_venv(builder, work):
    """A venv with nothing installed but a link to torch and its own requirements from ``builder``."""
    venv = os.path.join(work, "venv")
    subprocess.run([sys.executable if not builder else builder, "-m", "venv", "--clear", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    closure = torch_closure(builder)
    linked = os.path.join(work, "torch-site")
    os.makedirs(linked, exist_ok=True)
    for name in closure["names"]:
        for candidate in (name, name + ".py"):
            src = os.path.join(closure["site"], candidate)
            if os.path.exists(src) and not os.path.exists(os.path.join(linked, candidate)):
                os.symlink(src, os.path.join(linked, candidate))
    for entry in os.listdir(closure["site"]):  # their .dist-info too, so importlib.metadata sees the versions
        if entry.endswith(".dist-info") and re.sub(r"-[^-]+\.dist-info$", "", entry).replace("_", "-").lower() in {
                n.replace("_", "-").lower() for n in closure["names"]} | {"torch"}:
            os.symlink(os.path.join(closure["site"], entry), os.path.join(linked, entry))
    purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(purelib, "gpu_check_torch.pth"), "w") as f:
        f.write(linked + "\n")
    return py, closure["names"]


def dry_run(wheelhouse, work, builder):
    print("[dry-run] the plan (each step's budget is its timeout):")
    total = 0
    for name, budget, what in STEPS:
        total += budget
        print(f"  {name:<11} {budget:>4} s  {what}")
    print(f"  {'total':<11} {total:>4} s  of budgets; wall time {plan_wall_seconds()} s for a plain call, "
          f"{plan_wall_seconds(SECOND_CALL)} s for --only {','.join(SECOND_CALL)} (deadline 480 s each)")
    os.makedirs(work, exist_ok=True)
    if not wheelhouse:
        wheelhouse = os.path.join(work, "wheelhouse")
        pyver = "%d.%d" % sys.version_info[:2]
        print(f"[dry-run] building a wheelhouse for Python {pyver} (--full: everything but torch) in {wheelhouse}",
              flush=True)
        proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "offline-wheelhouse.sh"), "--full",
                               "--python-version", pyver, "--dest", wheelhouse, "--builder-python", builder],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
            return 1
    t0 = time.time()
    py, borrowed = fresh_venv(builder, work)
    print(f"[dry-run] fresh venv {os.path.dirname(os.path.dirname(py))}: torch and its requirements linked from "
          f"{builder} ({len(borrowed)} import names), nothing else", flush=True)
    site, tree = install(py, wheelhouse, work, sys.stdout)
    print(f"[dry-run] installed from {wheelhouse} alone (--no-index) and built fairseq in {tree}: "
          f"{time.time() - t0:.0f} s", flush=True)
    env = step_env(site, tree)
    where = subprocess.run([py, "-c", "import fairseq, hydra, omegaconf, bitarray, umst_plugin; "
                            "print(fairseq.__file__); print(hydra.__file__)"], env=env, capture_output=True, text=True)
    if where.returncode != 0:
        print(f"[dry-run] the fresh environment cannot import the plugin:\n{where.stderr[-3000:]}", file=sys.stderr)
        return 1
    fairseq_file, hydra_file = where.stdout.split()
    if not fairseq_file.startswith(tree) or not hydra_file.startswith(site):
        print(f"[dry-run] imports come from elsewhere: {fairseq_file}, {hydra_file}", file=sys.stderr)
        return 1
    cmds_path = os.path.join(work, "commands.json")
    with open(cmds_path, "w") as f:
        json.dump(commands(py, os.path.join(work, "run"), os.path.join(work, "out")), f)
    proc = subprocess.run([py, "-m", "benchmarks.gpu_check", "--check-commands", cmds_path], env=env, cwd=ROOT)
    if proc.returncode == 0:
        print("[dry-run] every command parses; the fresh environment imports fairseq and the plugin")
    return proc.returncode


def parser():
    p = argparse.ArgumentParser(prog="gpu-check", description="The project's GPU check (docs/tests-and-benchmarks.md).")
    p.add_argument("--wheelhouse", default=None,
                   help="folder made by scripts/offline-wheelhouse.sh (default: <repo>/.whl; the dry run builds one "
                        "for this Python when none is given)")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "results"),
                   help="where gpu-<device>.json / .md and gpu-check-log.txt go (default: docs/results)")
    p.add_argument("--work", default=None, help="scratch folder (default: /tmp/umst-gpu-check)")
    p.add_argument("--deadline", type=int, default=480, help="seconds from the start: steps run while time is left, the last one cut short at it (default 480)")
    p.add_argument("--only", default=None,
                   help="comma-separated steps to run (install is always needed); their results join this device's "
                        "last report. A plain call runs every step but " + ", ".join(SECOND_CALL) + "; "
                        "--only " + ",".join(SECOND_CALL) + " is the second call")
    p.add_argument("--python", default=sys.executable, help="the Python with torch to use (default: this one)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan; install into a fresh venv from the wheelhouse alone; check every command parses")
    p.add_argument("--report-env", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--check-commands", default=None, help=argparse.SUPPRESS)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if args.report_env:
        return report_env()
    if args.check_commands:
        return check_commands(args.check_commands)
    work = args.work or "/tmp/umst-gpu-check"
    if args.dry_run:
        if os.path.exists(work):
            shutil.rmtree(work)
        return dry_run(args.wheelhouse, work, args.python)
    wheelhouse = args.wheelhouse or os.path.join(ROOT, ".whl")
    only = set(args.only.split(",")) | {"install"} if args.only else None
    return run_plan(args.python, wheelhouse, work, args.out, args.deadline, only)


if __name__ == "__main__":
    raise SystemExit(main())
