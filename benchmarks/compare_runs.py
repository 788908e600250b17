"""Before/after tables from the JSON files that ``bench_archs.py`` and ``bench_op_counts.py`` write.

``docs/performance.md`` shows these tables; ``tests/test_docs.py`` renders them again from the JSON files in
``docs/results/`` and compares, so the page cannot drift from the measurements.

A page marks each such table with the command that renders it, paths relative to the page::

    <!-- compare_runs op-counts results/op-counts-cpu-before.json results/op-counts-cpu-after.json -->
    | arch | ... |

and ``python -m benchmarks compare-runs fill docs/performance.md`` re-renders every marked table in place.

Usage::

    python -m benchmarks compare-runs steps docs/results/perf-cpu-before-base.json docs/results/perf-cpu-after-base.json
    python -m benchmarks compare-runs op-counts docs/results/op-counts-cpu-before.json \\
        docs/results/op-counts-cpu-after.json --cuda docs/results/gpu-nvidia-h100-80gb-hbm3.json
"""
import argparse
import json
import os
import re
import shlex
import sys


def _load(path):
    with open(path) as f:
        return json.load(f)


def _arrow(before, after, fmt="{:.2f}"):
    b, a = fmt.format(before), fmt.format(after)
    return a if b == a else f"{b} → {a}"


def steps_markdown(before, after):
    """One row per arch of ``after``: the per-FLOP ratios against its baseline transformer, before → after,
    and the saved MiB, per precision that both runs measured."""
    old = {r["name"]: r for r in before["ratios"]}
    old_rows = {r["name"]: r for r in before["rows"]}
    new_rows = {r["name"]: r for r in after["rows"]}
    precisions = [p for p in after["precisions"] if p in before["precisions"]]
    baselines = {r.get("baseline", "transformer") for r in after["ratios"]} | {
        r["shape_baseline"] for r in after["ratios"] if "shape_baseline" in r}  # rows others are measured against
    head = ["arch", "baseline", "FLOPs"]
    for p in precisions:
        head += [f"saved MiB {p}", f"saved/FLOP {p}", f"time/FLOP {p}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for new in after["ratios"]:
        name = new["name"]
        if name in baselines or name not in old:
            continue
        prev = old[name]
        baseline = new["baseline"].replace("transformer_dropout", "tf, dropout 0.1").replace("transformer", "tf")
        cells = [new_rows[name]["arch"], baseline, f"{new['flops']:.2f}x"]
        for p in precisions:
            cells += [_arrow(old_rows[name]["saved"][p] / 2**20, new_rows[name]["saved"][p] / 2**20, "{:.0f}"),
                      _arrow(prev[p]["saved_per_flop"], new[p]["saved_per_flop"]),
                      _arrow(prev[p]["time_per_flop"], new[p]["time_per_flop"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shape_markdown(result):
    """The rows measured also against a transformer of their own shape (``BenchRow.shape_baseline``): the
    per-FLOP ratios against the transformer, against that one, and that one's own against the transformer."""
    ratios = {r["name"]: r for r in result["ratios"]}
    arch = {r["name"]: r["arch"] for r in result["rows"]}
    precisions = result["precisions"]
    head = ["arch", "against", "FLOPs"] + [f"saved/FLOP {p}" for p in precisions] + [f"time/FLOP {p}"
                                                                                     for p in precisions]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    def add(who, against, flops, per):
        lines.append("| " + " | ".join([who, against, f"{flops:.2f}x"]
                                        + [f"{per[p]['saved_per_flop']:.2f}" for p in precisions]
                                        + [f"{per[p]['time_per_flop']:.2f}" for p in precisions]) + " |")

    shown = set()
    for r in result["ratios"]:
        if "shape_baseline" not in r:
            continue
        shape = ratios[r["shape_baseline"]]
        if shape["name"] not in shown:
            shown.add(shape["name"])
            add(f"transformer of {arch[r['name']]}'s shape", "the transformer", shape["flops"], shape)
        add(arch[r["name"]], "the transformer", r["flops"], r)
        add(arch[r["name"]], "the transformer of its shape", r[precisions[0]]["vs_shape"]["flops"],
            {p: r[p]["vs_shape"] for p in precisions})
    return "\n".join(lines)


def _op_rows(data):
    data = data.get("op-counts", data)  # the GPU check's JSON nests bench_op_counts' output
    return {r["name"]: r for r in data["rows"]}


def op_counts_markdown(before, after, cuda=None):
    """fp32-only backward matmuls (bf16 autocast) and host syncs, before → after; the CUDA column from the
    GPU check's JSON when given."""
    old, new = _op_rows(before), _op_rows(after)
    gpu = _op_rows(cuda) if cuda else {}
    head = ["arch", "fp32-only backward matmuls, dropout on", "dropout off"]
    if gpu:
        head.append("on CUDA, dropout on")
    head += ["plugin syncs: training step", "first decoding step", "later decoding step",
             "fairseq syncs (train / first / later)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for name, r in new.items():
        p = old.get(name)
        if p is None:
            continue
        cells = [r["arch"], _arrow(p["fp32_backward_matmuls"], r["fp32_backward_matmuls"], "{}") +
                 f" (of {r['backward_matmuls']})",
                 _arrow(p["fp32_backward_matmuls_no_dropout"], r["fp32_backward_matmuls_no_dropout"], "{}")]
        if gpu:
            cells.append(str(gpu[name]["fp32_backward_matmuls"]) if name in gpu else "")
        for key in ("train_syncs", "decode_first_syncs", "decode_later_syncs"):
            cells.append(_arrow(p[key].get("plugin", 0), r[key].get("plugin", 0), "{}"))
        cells.append(" / ".join(str(r[k].get("fairseq", 0))
                                for k in ("train_syncs", "decode_first_syncs", "decode_later_syncs")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


TABLE_KINDS = {"archs": "bench_archs", "launches": "bench_launches", "train": "bench_train", "decode": "bench_decode",
               "speed": "speed_table"}


def _bench_module(name):
    import importlib

    return importlib.import_module(f"benchmarks.{name}")  # its table renderer (markdown) and labels


def launches_markdown(before, after):
    """Kernel launches of one update per arch (bench_launches.py), before → after: the total and forward +
    backward, and both per FLOP against stock fairseq's transformer."""
    old = {r["name"]: r for r in before["rows"]}
    head = ["arch", "launches", "forward + backward", "optimizer + grad norm + amp", "per FLOP vs stock",
            "fwd+bwd per FLOP vs stock"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    label_of = _bench_module("bench_launches").label_of
    for r in after["rows"]:
        if r["name"] not in old:
            continue
        o = old[r["name"]]

        def fb(x):
            return x["by_phase"]["forward"] + x["by_phase"]["backward"]

        def upd(x):
            return sum(x["by_phase"][k] for k in ("optimizer", "grad norm", "amp"))
        lines.append(f"| {label_of(r['name'], r['arch'])} | {_arrow(o['launches'], r['launches'], '{:,}')} | "
                     f"{_arrow(fb(o), fb(r), '{:,}')} | {_arrow(upd(o), upd(r), '{:,}')} | "
                     f"{_arrow(o['launches_per_flop_ratio'], r['launches_per_flop_ratio'])} | "
                     f"{_arrow(o['fwd_bwd_per_flop_ratio'], r['fwd_bwd_per_flop_ratio'])} |")
    return "\n".join(lines)


MARK = re.compile(r"^<!-- compare_runs (.+?) -->$")


def render(args, base_dir="."):
    """The table of one marker's arguments (``steps A B``, ``table A``, ``shape A``, ``op-counts A B [--cuda C]``)."""
    args = _parser().parse_args(args)

    def path(p):
        return os.path.join(base_dir, p)

    if args.what == "steps":
        return steps_markdown(_load(path(args.before)), _load(path(args.after)))
    if args.what == "shape":
        return shape_markdown(_load(path(args.result)))
    if args.what == "table":
        module = _bench_module(TABLE_KINDS[args.kind])
        result = _load(path(args.result))
        if args.kind == "speed":  # a speed record holds several tables: --key is the batch (tokens), "targets"
            key = args.key or str(result["max_tokens"][0])  # or kernels-TOKENS (the profiled updates)
            if key.startswith("kernels-"):
                return "\n".join(module.kernel_markdown(result, key[len("kernels-"):]))
            return "\n".join(module.table_markdown(result, key))
        return module.markdown(result[args.key] if args.key else result)
    if args.what == "launches":
        return launches_markdown(_load(path(args.before)), _load(path(args.after)))
    if args.what == "op-counts":
        return op_counts_markdown(_load(path(args.before)), _load(path(args.after)),
                                  _load(path(args.cuda)) if args.cuda else None)
    raise SystemExit(f"compare_runs: a marker cannot run {args.what!r}")


def marked_tables(page):
    """Per marker of the page: (line number, its arguments, the table that follows it on the page)."""
    with open(page) as f:
        lines = f.read().split("\n")
    out = []
    for i, line in enumerate(lines):
        m = MARK.match(line.strip())
        if m:
            j = i + 1
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append((i + 1, shlex.split(m.group(1)), "\n".join(lines[i + 1:j])))
    return out


def fill(page):
    """Re-render every marked table of the page in place; returns how many."""
    with open(page) as f:
        lines = f.read().split("\n")
    out, i, n = [], 0, 0
    while i < len(lines):
        out.append(lines[i])
        m = MARK.match(lines[i].strip())
        i += 1
        if m:
            out.extend(render(shlex.split(m.group(1)), os.path.dirname(page)).split("\n"))
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            n += 1
    with open(page, "w") as f:
        f.write("\n".join(out))
    return n


def _parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("steps", help="two bench_archs.py JSON files")
    s.add_argument("before")
    s.add_argument("after")
    t = sub.add_parser("table", help="one benchmark's JSON file: its whole table (bench_archs.py unless --kind)")
    t.add_argument("result")
    t.add_argument("--key", default=None, help="the step of a GPU check's JSON that holds the run (bench-base); "
                   "with --kind speed, the batch in tokens (default the recipe's), targets, or kernels-TOKENS")
    t.add_argument("--kind", choices=sorted(TABLE_KINDS), default="archs",
                   help="which benchmark wrote it: archs, launches, train, decode or speed (speed_table.py; "
                        "--key: the batch in tokens, or targets)")
    la = sub.add_parser("launches", help="two bench_launches.py JSON files: launches per update, before -> after")
    la.add_argument("before")
    la.add_argument("after")
    h = sub.add_parser("shape", help="one bench_archs.py JSON file: the rows with a transformer of their shape")
    h.add_argument("result")
    o = sub.add_parser("op-counts", help="two bench_op_counts.py JSON files")
    o.add_argument("before")
    o.add_argument("after")
    o.add_argument("--cuda", default=None, help="the GPU check's JSON (its op-counts step)")
    f = sub.add_parser("fill", help="re-render every marked table of a page in place")
    f.add_argument("page")
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.what == "fill":
        print(f"{args.page}: {fill(args.page)} table(s) rendered")
    else:
        print(render(argv if argv is not None else sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
