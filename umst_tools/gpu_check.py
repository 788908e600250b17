"""The GPU check: everything a lent GPU should run, in one call of under 8 minutes, from the project's own files.

Run by ``scripts/gpu-check.sh``. The machine has a Python with torch (CUDA) and no internet; the checkout
carries a wheelhouse (``scripts/offline-wheelhouse.sh``: fairseq-fixed's source archive and wheels of what
the machine lacks). Steps, each with a time budget (its timeout) printed as it starts and ends:

  install     wheels -> ``<work>/site`` (``pip --no-index --no-deps --target``); fairseq-fixed's sdist
              unpacked and its three light extensions compiled in place (``fairseq_source``)
  env         Python, torch, CUDA, the device, fairseq, the plugin's archs registered
  toy-data    the toy corpus, fairseq-preprocess, umst-preprocess (gold CoNLL-U parses)
  train-fp32, train-bf16
              200 updates of ``umst_base`` (full base width) on the toy corpus, fp32 and ``--amp --amp-dtype
              bfloat16``, same seed; the mean training loss of the last 50 updates must agree within 2%
  tests       the tests marked ``cuda`` (``pytest -m cuda``: the model checks on the GPU, fp32/fp16/bf16)
  op-counts   ``benchmarks/bench_op_counts.py`` on CUDA: fp32-only backward matmuls, host syncs per step
  bench-base  ``benchmarks/bench_archs.py`` at base width on the GPU, fp16 and bf16 autocast, 4,096 tokens
  bench-big   bench_archs.py at big width for the two largest memory ratios (TranSFormer, Prime)

A step that fails or runs out of time is recorded and the next one runs (steps that need fairseq are skipped
if the install failed); ``--deadline`` cuts the last step short and skips what has no time left. Results,
rewritten after every step (a call killed at its limit keeps what was measured): ``<out>/gpu-<device>.json``
(every step, the tables' numbers), ``<out>/gpu-<device>.md`` (the tables) and ``<out>/gpu-check-log.txt``
(each step's output).

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
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(ROOT, "umst_plugin")
TRAIN_UPDATES = 200
LOSS_TOLERANCE = 0.02

# name, budget in seconds (the step's timeout), what it is for; in the order they run: the GPU's
# correctness first (install, the bf16 training, the CUDA tests), then the measurements.
STEPS = [
    ("install", 60, "wheels into <work>/site; fairseq-fixed's sdist unpacked, its light extensions compiled"),
    ("env", 15, "Python, torch, CUDA, device, fairseq; the plugin's archs register"),
    ("toy-data", 30, "toy corpus, fairseq-preprocess, umst-preprocess --parser conllu"),
    ("train-fp32", 60, f"{TRAIN_UPDATES} updates of umst_base on the toy corpus, fp32"),
    ("train-bf16", 60, f"{TRAIN_UPDATES} updates of umst_base on the toy corpus, --amp --amp-dtype bfloat16"),
    ("tests", 70, "pytest -m cuda: the model checks on the GPU"),
    ("op-counts", 30, "bench_op_counts.py on CUDA: fp32-only backward matmuls under bf16, host syncs per step"),
    ("bench-base", 75, "bench_archs.py, base width, fp16 and bf16 autocast, 4,096 tokens"),
    ("bench-big", 45, "bench_archs.py, big width, TranSFormer and Prime"),
]
NEEDS_FAIRSEQ = {name for name, _, _ in STEPS} - {"install"}
NEEDS = {"train-fp32": "toy-data", "train-bf16": "toy-data"}
MIN_STEP_SECONDS = 15  # a step that would get less time before the deadline is skipped

TOY = ("kel", "mor")


def train_argv(py, databin, amp):
    argv = [py, "-m", "fairseq_cli.train", databin, "--user-dir", PLUGIN, "--task", "multiscale_translation",
            "--arch", "umst_base", "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
            "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "4096",
            "--max-update", str(TRAIN_UPDATES), "--seed", "1", "--no-save", "--disable-validation",
            "--log-format", "json", "--log-interval", "10", "--num-workers", "0"]
    if amp:
        argv += ["--amp", "--amp-dtype", "bfloat16"]
    return argv


def commands(py, work, out):
    """Step name -> list of argv lists (run in order, in the repo root)."""
    toy = os.path.join(work, "toy")
    raw, databin = os.path.join(toy, "raw"), os.path.join(toy, "data-bin")
    src, tgt = TOY
    bench = os.path.join(ROOT, "benchmarks", "bench_archs.py")
    return {
        "env": [[py, "-m", "umst_tools.gpu_check", "--report-env"]],
        "tests": [[py, "-m", "pytest", "-m", "cuda", "-q", "-n", "14", "-p", "no:cacheprovider",
                   "--junitxml", os.path.join(work, "gpu-tests.xml"), "tests/test_model_checks.py"]],
        "op-counts": [[py, os.path.join(ROOT, "benchmarks", "bench_op_counts.py"), "--device", "cuda",
                       "--json", os.path.join(work, "op-counts.json")]],
        "bench-base": [[py, bench, "--device", "cuda", "--precisions", "fp16,bf16", "--max-tokens", "4096",
                        "--repeats", "4", "--warmup", "1", "--json", os.path.join(work, "bench-base.json")]],
        "toy-data": [
            [py, "-m", "umst_plugin.toy", raw],
            [py, "-m", "fairseq_cli.preprocess", "--source-lang", src, "--target-lang", tgt,
             "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test",
             "--destdir", databin, "--joined-dictionary", "--workers", "8"],
            [py, "-m", "umst_plugin.preprocess", "--source-lang", src, "--target-lang", tgt,
             "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test",
             "--destdir", databin, "--parser", "conllu"],
        ],
        "train-fp32": [train_argv(py, databin, amp=False)],
        "train-bf16": [train_argv(py, databin, amp=True)],
        "bench-big": [[py, bench, "--device", "cuda", "--width", "big", "--archs", "transformer_sf,prime",
                       "--precisions", "fp16,bf16", "--max-tokens", "4096", "--repeats", "6", "--warmup", "2",
                       "--json", os.path.join(work, "bench-big.json")]],
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
    from umst_tools import fairseq_source

    site = os.path.join(work, "site")
    wheels = wheel_files(wheelhouse)
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


def run_plan(py, wheelhouse, work, out, deadline, only=None):
    os.makedirs(work, exist_ok=True)
    os.makedirs(out, exist_ok=True)
    log_path = os.path.join(out, "gpu-check-log.txt")
    log = open(log_path, "w")
    start = time.time()
    result = dict(started=time.strftime("%Y-%m-%d %H:%M:%S %Z"), host_python=py, steps=[])
    site = tree = None
    status = {}
    cmds = commands(py, work, out)
    for name, budget, what in STEPS:
        if only and name not in only:
            continue
        elapsed = time.time() - start
        entry = dict(name=name, budget_s=budget, what=what)
        result["steps"].append(entry)
        if name in NEEDS_FAIRSEQ and status.get("install") != "ok":
            entry["status"] = "skipped (install failed)"
        elif NEEDS.get(name) and status.get(NEEDS[name]) != "ok":
            entry["status"] = f"skipped ({NEEDS[name]} failed)"
        elif deadline - elapsed < MIN_STEP_SECONDS:
            entry["status"] = f"skipped (only {deadline - elapsed:.0f} s left before the {deadline} s deadline)"
        if "status" in entry:
            status[name] = "skipped"
            print(f"[gpu-check] {name}: {entry['status']}", flush=True)
            continue
        budget = min(budget, int(deadline - elapsed))  # the deadline cuts the last step short
        entry["budget_s"] = budget
        print(f"[gpu-check] {name} (budget {budget} s, at {elapsed:.0f} s): {what}", flush=True)
        log.write(f"\n===== {name} (budget {budget} s)\n")
        t0 = time.time()
        output = ""
        try:
            if name == "install":
                site, tree = install(py, wheelhouse, work, log)
                rc = 0
            else:
                rc = 0
                for argv in cmds[name]:
                    remaining = budget - (time.time() - t0)
                    log.write("$ " + shlex.join(argv) + "\n")
                    proc = subprocess.run(argv, cwd=ROOT, env=step_env(site, tree), capture_output=True, text=True,
                                          timeout=max(remaining, 1))
                    output += proc.stdout + proc.stderr
                    log.write(proc.stdout[-20000:] + proc.stderr[-20000:])
                    rc = proc.returncode
                    if rc != 0:
                        break
            entry["status"] = "ok" if rc == 0 else f"failed (rc {rc})"
        except subprocess.TimeoutExpired as e:
            for stream in (e.stdout, e.stderr):
                text = stream.decode(errors="replace") if isinstance(stream, bytes) else (stream or "")
                output += text
                log.write(text[-20000:])
            entry["status"] = f"timed out after {budget} s"
        except Exception as e:  # noqa: BLE001  (a failed step is recorded; the check goes on)
            entry["status"] = f"failed: {type(e).__name__}: {str(e)[:500]}"
            log.write(entry["status"] + "\n")
        entry["seconds"] = round(time.time() - t0, 1)
        status[name] = "ok" if entry["status"] == "ok" else "failed"
        collect(name, entry, output, work, result)
        print(f"[gpu-check] {name}: {entry['status']} in {entry['seconds']} s (budget {budget} s)", flush=True)
        log.flush()
        write_results(result, out, start)  # after every step: a run cut short keeps what it measured
    base = write_results(result, out, start)
    log.close()
    print(markdown(result))
    print(f"[gpu-check] wrote {base}.json, {base}.md, {log_path} ({result['total_seconds']} s)")
    return 0 if all(s["status"] == "ok" for s in result["steps"]) else 1


def compare_training(result):
    """fp32 against bf16 on the same updates: the mean logged training loss over the last 50 updates both runs
    reached (a run cut short by its step's time budget is compared where it stopped)."""
    a, b = dict(map(tuple, result["train-fp32"]["losses"])), dict(map(tuple, result["train-bf16"]["losses"]))
    common = sorted(set(a) & set(b))
    if not common:
        return
    last = [u for u in common if u > common[-1] - 50]
    fp32, bf16 = sum(a[u] for u in last) / len(last), sum(b[u] for u in last) / len(last)
    result["train_compared_updates"] = [last[0], last[-1]]
    result["train_loss_fp32"], result["train_loss_bf16"] = fp32, bf16
    result["train_loss_rel_diff"] = abs(bf16 - fp32) / fp32
    result["train_loss_within_2pct"] = result["train_loss_rel_diff"] <= LOSS_TOLERANCE


def write_results(result, out, start):
    result["total_seconds"] = round(time.time() - start, 1)
    if "train-fp32" in result and "train-bf16" in result:
        compare_training(result)
    device = result.get("env", {}).get("device", "no-gpu")
    base = os.path.join(out, f"gpu-{slug(device)}")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(result))
    return base


def collect(name, entry, output, work, result):
    """Pull the step's numbers out of its output into ``result``."""
    if name == "env":
        m = re.search(r"^GPUCHECK-ENV (\{.*\})$", output, flags=re.M)
        if m:
            result["env"] = json.loads(m.group(1))
    elif name == "tests":
        entry["summary"] = pytest_summary(output.strip().splitlines()[-1] if output.strip() else "")
        entry["failures"] = re.findall(r"^FAILED (\S+)", output, flags=re.M)[:40]
    elif name.startswith("bench-") or name == "op-counts":
        path = os.path.join(work, f"{name}.json")
        if os.path.exists(path):
            with open(path) as f:
                result[name] = json.load(f)
    elif name.startswith("train-"):
        points = train_losses(output)
        if points:
            wps = [float(x) for x in re.findall(r'"wps": "?([\d.]+)', output)]
            result[name] = dict(updates=max(u for u, _ in points), loss_last50=tail_mean(points),
                                losses=points, seconds=entry["seconds"],
                                wps_median=sorted(wps)[len(wps) // 2] if wps else None)


def markdown(result):
    env = result.get("env", {})
    lines = [f"# GPU check: {env.get('device', 'no GPU')}", "",
             f"torch {env.get('torch', '?')} (CUDA {env.get('cuda', '?')}), Python {env.get('python', '?')}, "
             f"fairseq {env.get('fairseq', '?')}; started {result['started']}, {result.get('total_seconds', '?')} s "
             "in all (`bash scripts/gpu-check.sh`).", "",
             "| step | status | seconds | budget |", "|---|---|---|---|"]
    for s in result["steps"]:
        extra = ""
        if s.get("summary"):
            extra = " (" + ", ".join(f"{v} {k}" for k, v in s["summary"].items()) + ")"
        lines.append(f"| {s['name']} | {s['status']}{extra} | {s.get('seconds', '')} | {s['budget_s']} |")
    failures = [f for s in result["steps"] for f in s.get("failures", [])]
    if failures:
        lines += ["", "Failed tests: " + ", ".join(f"`{f}`" for f in failures)]
    for key, title in (("bench-base", "Base width"), ("bench-big", "Big width")):
        if key in result:
            bench = result[key]
            lines += ["", f"## {title}: one training step against the pre-norm transformer", "",
                      f"{bench['sentences']} sentences of Multi30k lengths ({bench['max_tokens']} max tokens), "
                      "CUDA-event median of "
                      f"{bench['repeats']}; saved = bytes autograd keeps for backward; peak = "
                      "`torch.cuda.max_memory_allocated` during the step; per-FLOP ratios against the transformer.",
                      "", bench_table(bench)]
    if "op-counts" in result:
        lines += ["", "## Matmuls and host syncs on CUDA (bench_op_counts.py)", "",
                  "Per arch at base width, 8 sentences: matrix products of one backward pass under bf16 autocast "
                  "whose inputs are all float32; host-device syncs per training step and decoding step (plugin / "
                  "fairseq).", "", op_counts_table(result["op-counts"])]
    if "train-fp32" in result and "train-bf16" in result:
        a, b = result["train-fp32"], result["train-bf16"]
        first, final = result.get("train_compared_updates", ["?", "?"])
        lines += ["", f"## umst_base, {TRAIN_UPDATES} updates on the toy corpus", "",
                  f"| precision | updates reached | mean train loss, updates {first}-{final} | wall s | words/s (median) |",
                  "|---|---|---|---|---|",
                  f"| fp32 | {a['updates']} | {result.get('train_loss_fp32', float('nan')):.4f} | {a['seconds']} | "
                  f"{a['wps_median']} |",
                  f"| bf16 `--amp` | {b['updates']} | {result.get('train_loss_bf16', float('nan')):.4f} | "
                  f"{b['seconds']} | {b['wps_median']} |", ""]
        if "train_loss_rel_diff" in result:
            lines.append(f"Relative difference {100 * result['train_loss_rel_diff']:.2f}% "
                         f"({'within' if result['train_loss_within_2pct'] else 'NOT within'} 2%).")
    return "\n".join(lines) + "\n"


def op_counts_table(counts):
    def split(c):
        return f"{c.get('plugin', 0)} / {c.get('fairseq', 0)}"
    lines = ["| arch | fp32-only backward matmuls (of all), dropout on / off | syncs: training step | first decoding "
             "step | later decoding step |", "|---|---|---|---|---|"]
    for r in counts["rows"]:
        lines.append(f"| {r['arch']} | {r['fp32_backward_matmuls']} / {r['fp32_backward_matmuls_no_dropout']} "
                     f"({r['backward_matmuls']}) | {split(r['train_syncs'])} | {split(r['decode_first_syncs'])} | "
                     f"{split(r['decode_later_syncs'])} |")
    return "\n".join(lines)


def bench_table(bench):
    precisions = bench["precisions"]
    by_name = {r["name"]: r for r in bench["rows"]}
    head = ["arch", "GFLOP", "FLOPs"]
    for p in precisions:
        head += [f"saved {p} MiB", "saved/FLOP", f"peak {p} MiB", f"{p} ms", "tok/s", "time/FLOP"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for ratio in bench["ratios"]:
        r = by_name[ratio["name"]]
        cells = [r["arch"], f"{r['flops'] / 1e9:.0f}", f"{ratio['flops']:.2f}x"]
        for p in precisions:
            cells += [f"{r['saved'][p] / 2**20:.0f}", f"{ratio[p]['saved_per_flop']:.2f}",
                      f"{r['peak'][p] / 2**20:.0f}", f"{r['time'][p] * 1000:.1f}",
                      f"{r['tokens_per_s'][p]:.0f}", f"{ratio[p]['time_per_flop']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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


def check_one(argv):
    args = argv[1:]
    if args[:2] == ["-m", "umst_tools.gpu_check"]:
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
    elif args[0].endswith("bench_op_counts.py"):
        proc = subprocess.run([argv[0], args[0], "--help"], cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0 or "--device" not in proc.stdout:
            raise RuntimeError(proc.stderr[-1500:])
    elif args[0].endswith("bench_archs.py"):
        proc = subprocess.run([argv[0]] + args + ["--dry-run"], cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-1500:])
    elif args[:2] == ["-m", "umst_plugin.toy"]:
        from umst_plugin import toy

        toy.get_parser().parse_args(args[2:])
    elif args[:2] == ["-m", "umst_plugin.preprocess"]:
        from umst_plugin.preprocess import cli

        cli.get_parser().parse_args(args[2:])
    elif args[:2] == ["-m", "fairseq_cli.preprocess"]:
        from fairseq import options

        options.get_preprocessing_parser().parse_args(args[2:])
    elif args[:2] == ["-m", "fairseq_cli.train"]:
        from fairseq import options

        options.parse_args_and_arch(options.get_training_parser(), args[2:])
    else:
        raise RuntimeError(f"no parse check known for {argv}")


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
    print(f"  {'total':<11} {total:>4} s  (deadline 480 s)")
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
    proc = subprocess.run([py, "-m", "umst_tools.gpu_check", "--check-commands", cmds_path], env=env, cwd=ROOT)
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
    p.add_argument("--only", default=None, help="comma-separated steps to run (install is always needed)")
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
