"""How long Triton takes to compile each kernel of a GPU program, measured on a machine without a GPU.

``python -m benchmarks launches --compile --simulate-gpu h200 --dump-gpu-code DIR`` writes the programs inductor
generates for a simulated H200 (``umst_dev/simulated_gpu.py``) without compiling their Triton kernels. A GPU
machine compiles each kernel once per autotuning config (Triton to PTX, ptxas to a cubin) before the first update
can run, so one slow kernel holds a compiled region back. This tool compiles every kernel of those programs, every
config, for the device's architecture (sm_90 for an H200) with the Triton and ptxas of the CUDA build of torch,
and times each; no driver is needed.

    python -m umst_dev.triton_compile_times DIR [--json OUT] [--top 10]

Found with it: two persistent scans of TranSFormer's input region took 161 s and 212 s (one config each), every
other kernel under 4 s; ``umst_plugin/patches/inductor_scan.py`` is the fix. Timings are this CPU's, one
config at a time; a GPU machine compiles several kernels at once in inductor's worker processes.
"""
import argparse
import glob
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
from unittest import mock

KERNEL = re.compile(r"async_compile\.triton\('([^']+)', '''(.*?)''', device_str='cuda'\)", re.S)


def kernels(program_path):
    """(name, Triton source) of every kernel a dumped wrapper defines."""
    with open(program_path) as f:
        return KERNEL.findall(f.read())


def _load(name, source, folder):
    """The kernel's ``CachingAutotuner`` (inductor's decorator over the ``triton.jit`` function), from its source
    (which selects the GPU driver on import: :func:`measure` makes that a no-op while it loads)."""
    path = os.path.join(folder, f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def compile_kernel(tuner, arch=90, warp_size=32):
    """Seconds to compile each of the autotuner's configs for ``sm_<arch>``, as inductor's ``_precompile_config``
    calls ``triton.compile``: [(config, seconds)]."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    times = []
    for config in tuner.configs:
        meta = tuner._create_compile_meta(config)
        options = tuner._create_compile_options(config, meta)
        start = time.perf_counter()
        triton.compile(ASTSource(tuner.fn, meta["signature"], meta["constants"], meta["configs"][0]),
                       target=GPUTarget("cuda", arch, warp_size), options=options)
        times.append((str(config), time.perf_counter() - start))
    return times


def measure(folder, arch=90, log=print):
    """Every kernel of every program in ``folder``: {program, kernel, configs: [[config, seconds]], seconds}."""
    import torch._inductor.runtime.triton_helpers as triton_helpers

    rows = []
    # no driver here (the target is given to triton.compile); restored after, for the rest of the process
    with tempfile.TemporaryDirectory() as sources, mock.patch.object(triton_helpers, "set_driver_to_gpu", lambda: None):
        for path in sorted(glob.glob(os.path.join(folder, "*.py"))):
            for name, source in kernels(path):
                times = compile_kernel(_load(name, source, sources), arch)
                rows.append(dict(program=os.path.basename(path), kernel=name,
                                 configs=[[c, round(s, 2)] for c, s in times],
                                 seconds=round(sum(s for _, s in times), 2)))
                log(f"{rows[-1]['seconds']:8.2f} s  {len(times)} config(s)  {rows[-1]['program']}  {name}")
    return rows


def per_row(rows):
    """Totals per benchmark row (a program file is ``<row>-<index>-forward.py`` or ``-backward.py``): kernels,
    seconds, the slowest kernel's seconds."""
    totals = {}
    for r in rows:
        name = r["program"].rsplit("-", 2)[0]
        t = totals.setdefault(name, dict(kernels=0, seconds=0.0, slowest_s=0.0))
        t["kernels"] += 1
        t["seconds"] = round(t["seconds"] + r["seconds"], 2)
        t["slowest_s"] = max(t["slowest_s"], r["seconds"])
    return totals


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="a --dump-gpu-code folder of python -m benchmarks launches")
    p.add_argument("--arch", type=int, default=90, help="the compute capability to compile for (90: H100, H200)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--top", type=int, default=10, help="print the slowest kernels")
    args = p.parse_args(argv)
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-cache-"))  # cold: measure it all
    rows = measure(args.folder, args.arch)
    total = sum(r["seconds"] for r in rows)
    print(f"\n{len(rows)} kernels, {sum(len(r['configs']) for r in rows)} configs: {total:.1f} s of Triton "
          f"compiling (one at a time on this CPU)")
    by_row = per_row(rows)
    for name, row in by_row.items():
        print(f"  {name}: {row['kernels']} kernels, {row['seconds']:.1f} s, the slowest {row['slowest_s']:.1f} s")
    print("the slowest kernels:")
    for r in sorted(rows, key=lambda r: -r["seconds"])[:args.top]:
        print(f"{r['seconds']:8.2f} s  {r['program']}  {r['kernel'][:100]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(folder=args.folder, arch=args.arch, total_s=round(total, 1), rows=by_row, kernels=rows), f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
