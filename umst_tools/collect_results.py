#!/usr/bin/env python3
"""The table rows the recipes reproduce, and a markdown table of finished runs next to them.

``ROWS`` holds every row, read from configs/tables/paper-rows.yaml (the one place that names them): its
config (configs/<row>.yaml), the paper's numbers, the GPUs the config assumes and the decoding settings.
train.sh and evaluate.sh read it through ``--row-info``.

    python scripts/collect_results.py RUNS_DIR [RUNS_DIR ...] [--output results.md] [--all-rows]
    python scripts/collect_results.py --row-info umst-t2-umst-base beam   # -> 4

A finished run is a ``results.json`` written by evaluate.sh (anywhere under RUNS_DIR).
"""
import argparse
import json
import os
import sys

import yaml  # PyYAML, a dependency of omegaconf (fairseq's config)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "configs", "tables", "paper-rows.yaml")


def load_rows(path=TABLE):
    """Row name -> its fields (paper, table, model, dataset, arch, bleu, sacrebleu, params, gpus, gpu_hours,
    beam, lenpen, average, note), in the file's order, each row's missing fields from the file's ``defaults``."""
    with open(path, encoding="utf-8") as f:
        table = yaml.safe_load(f)
    return {name: {**table["defaults"], **fields} for name, fields in table["rows"].items()}


ROWS = load_rows()


def find_results(dirs):
    found = {}
    for top in dirs:
        for dirpath, _, files in os.walk(top):
            if "results.json" in files:
                path = os.path.join(dirpath, "results.json")
                with open(path, encoding="utf-8") as f:
                    res = json.load(f)
                res["_path"] = path
                found.setdefault(res.get("row", os.path.basename(dirpath)), []).append(res)
    return found


def _fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def _delta(ours, paper):
    return "-" if ours is None or paper is None else f"{ours - paper:+.2f}"


def markdown_table(results, all_rows=False):
    lines = ["| row | paper / table | model | data | paper BLEU | ours BLEU | delta | paper sacreBLEU | "
             "ours sacreBLEU | delta | checkpoint | run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    names = list(ROWS) if all_rows else [r for r in ROWS if r in results]
    names += sorted(r for r in results if r not in ROWS)
    for name in names:
        meta = ROWS.get(name, {})
        for res in results.get(name, [None]):
            ours = None if res is None else res.get("tok_bleu")
            ours_sb = None if res is None else res.get("sacrebleu")
            lines.append("| " + " | ".join([
                name, f"{meta.get('paper', '?')} t{meta.get('table', '?')}", meta.get("model", "?"),
                (res or {}).get("data_name") or meta.get("dataset", "?"),
                _fmt(meta.get("bleu")), _fmt(ours), _delta(ours, meta.get("bleu")),
                _fmt(meta.get("sacrebleu"), 1), _fmt(ours_sb), _delta(ours_sb, meta.get("sacrebleu")),
                (res or {}).get("checkpoint_name", "-"), "not run" if res is None else os.path.dirname(res["_path"]),
            ]) + " |")
    signatures = sorted({r.get("sacrebleu_signature") for rs in results.values() for r in rs
                         if r.get("sacrebleu_signature")})
    if signatures:
        lines.append("")
        lines += [f"sacreBLEU signature: `{s}`" for s in signatures]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="directories searched for results.json")
    p.add_argument("--output", help="write the markdown table here (default: stdout)")
    p.add_argument("--all-rows", action="store_true", help="list rows without results too")
    p.add_argument("--row-info", nargs=2, metavar=("ROW", "FIELD"), help="print one field of a row and exit")
    args = p.parse_args(argv)
    if args.row_info:
        row, field = args.row_info
        if row not in ROWS:
            print(f"unknown row {row!r}; rows: {', '.join(ROWS)}", file=sys.stderr)
            return 2
        print(ROWS[row][field])
        return 0
    table = markdown_table(find_results(args.runs), args.all_rows)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(table)
    else:
        sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
