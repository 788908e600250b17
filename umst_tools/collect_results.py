#!/usr/bin/env python3
"""The table rows the recipes reproduce, and a markdown table of finished runs next to them.

``ROWS`` is the one place that names every row: its config (configs/<row>.yaml),
the paper's numbers, the GPUs the config assumes and the decoding settings.
train.sh and evaluate.sh read it through ``--row-info``.

    python scripts/collect_results.py RUNS_DIR [RUNS_DIR ...] [--output results.md] [--all-rows]
    python scripts/collect_results.py --row-info umst-t2-umst-base beam   # -> 4

A finished run is a ``results.json`` written by evaluate.sh (anywhere under RUNS_DIR).
"""
import argparse
import json
import os
import sys

# GPU-hours: what the paper states, else "n/s" (not stated) and a rough estimate = tokens the config
# processes / an assumed per-GPU throughput (fairseq fp16: V100 ~55K tok/s base, ~20K big; P100 ~15K base,
# ~6K big). Order of magnitude only; see docs/recipes.md ("The rows").
_H_UMST_BASE = "n/s; est. ~150 V100-h (50K updates x 614K tokens)"
_H_UMST_BIG = "n/s; est. ~430 V100-h (50K updates x 614K tokens)"
_H_RO = "n/s; est. ~10 V100-h (60K updates x 33K tokens)"
_H_MSC = "n/s (8 P100); est. ~120 P100-h for 6 layers, 3-5x for 36/48 (100K updates x 65K tokens)"
_H_MSC_BIG = "n/s (8 P100); est. ~900 P100-h for 6 layers (300K updates x 65K tokens)"
_H_PRIME = "stated: 2-3 days on 4 Titan RTX = 190-290 GPU-h"


def _row(paper, table, model, dataset, arch, bleu, sacrebleu=None, params=None, gpus=8, gpu_hours="n/s",
         beam=4, lenpen=0.6, average="epoch:5", note=""):
    return dict(paper=paper, table=table, model=model, dataset=dataset, arch=arch, bleu=bleu, sacrebleu=sacrebleu,
                params=params, gpus=gpus, gpu_hours=gpu_hours, beam=beam, lenpen=lenpen, average=average,
                note=note)


ROWS = {
    # --- UMST (Li et al., ICML 2022), table 2: WMT14 En-De, tokenized BLEU ------------------------
    "umst-t2-transformer-base": _row("UMST", "2", "Transformer (pre-norm) base", "wmt14_en_de",
                                     "transformer_wmt_en_de", 27.63, params="65M", gpu_hours=_H_UMST_BASE),
    "umst-t2-transformer-big": _row("UMST", "2", "Transformer (pre-norm) big", "wmt14_en_de",
                                    "transformer_vaswani_wmt_en_de_big", 29.31, params="216M", gpu_hours=_H_UMST_BIG),
    "umst-t2-muse-base": _row("UMST", "2", "MUSE (Prime) base, re-implemented by UMST", "wmt14_en_de", "prime_base",
                              27.97, params="68M", gpu_hours=_H_UMST_BASE),
    "umst-t2-muse-big": _row("UMST", "2", "MUSE (Prime) big, re-implemented by UMST", "wmt14_en_de", "prime_big",
                             29.11, params="233M", gpu_hours=_H_UMST_BIG),
    "umst-t2-msmsa-base": _row("UMST", "2", "MSMSA base, re-implemented by UMST", "wmt14_en_de", "msmsa_base",
                               27.57, params="65M", gpu_hours=_H_UMST_BASE),
    "umst-t2-msmsa-big": _row("UMST", "2", "MSMSA big, re-implemented by UMST", "wmt14_en_de", "msmsa_big",
                              28.84, params="233M", gpu_hours=_H_UMST_BIG),
    "umst-t2-umst-base": _row("UMST", "2", "UMST base", "wmt14_en_de", "umst_base", 28.51, params="70M",
                              gpu_hours=_H_UMST_BASE),
    "umst-t2-umst-big": _row("UMST", "2", "UMST big", "wmt14_en_de", "umst_big", 29.75, params="242M",
                             gpu_hours=_H_UMST_BIG),
    "umst-t2-umst-rpr-base": _row("UMST", "2", "UMST + RPR base", "wmt14_en_de", "umst_base_rpr", 28.90,
                                  params="70M", gpu_hours=_H_UMST_BASE),
    "umst-t2-umst-rpr-big": _row("UMST", "2", "UMST + RPR big", "wmt14_en_de", "umst_big_rpr", 30.15,
                                 params="242M", gpu_hours=_H_UMST_BIG),
    # --- UMST table 3: WMT16 En-Ro -------------------------------------------------------------
    "umst-t3-transformer-base": _row("UMST", "3", "Transformer (pre-norm) base", "wmt16_en_ro",
                                     "transformer_wmt_en_de", 34.21, params="54M", gpu_hours=_H_RO),
    "umst-t3-umst-base": _row("UMST", "3", "UMST base", "wmt16_en_ro", "umst_base", 34.81, params="60M",
                              gpu_hours=_H_RO),
    "umst-t3-umst-rpr-base": _row("UMST", "3", "UMST + RPR base", "wmt16_en_ro", "umst_base_rpr", 35.31,
                                  params="60M", gpu_hours=_H_RO),
    # --- TranSFormer (Li et al., ACL 2023), table 1: WMT14 En-De, multi-bleu (sacreBLEU) ---------
    "sf-t1-slow-only-base": _row("TranSFormer", "1", "Slow only (pre-norm Transformer) base", "wmt14_en_de",
                                 "transformer_wmt_en_de", 27.40, 26.4, params="63M", gpu_hours=_H_UMST_BASE),
    "sf-t1-slow-only-big": _row("TranSFormer", "1", "Slow only (pre-norm Transformer) big", "wmt14_en_de",
                                "transformer_vaswani_wmt_en_de_big", 28.80, 27.8, params="211M",
                                gpu_hours=_H_UMST_BIG),
    "sf-t1-transformer-sf-base": _row("TranSFormer", "1", "TranSFormer (hidden 32) base", "wmt14_en_de",
                                      "transformer_sf_base", 28.56, 27.6, params="66M", gpu_hours=_H_UMST_BASE),
    "sf-t1-transformer-sf-big": _row("TranSFormer", "1", "TranSFormer big", "wmt14_en_de", "transformer_sf_big",
                                     29.85, 28.9, params="231M", gpu_hours=_H_UMST_BIG),
    "sf-t1-fast-only-h32-base": _row("TranSFormer", "1", "Fast Only (Hidden=32, L=6) base: characters only",
                                     "wmt14_en_de", "transformer_sf_fast_only_base", 17.90, 16.9, params="42M",
                                     gpu_hours=_H_UMST_BASE),
    "sf-t1-fast-only-h512-base": _row("TranSFormer", "1", "Fast Only (Hidden=512, L=6) base: characters only",
                                      "wmt14_en_de", "transformer_sf_fast_only_base", 27.11, 26.1, params="64M",
                                      gpu_hours=_H_UMST_BASE),
    "sf-t1-fast-only-h512-big": _row("TranSFormer", "1", "Fast Only (Hidden=512, L=6) big: characters only",
                                     "wmt14_en_de", "transformer_sf_fast_only_big", 28.65, 27.6, params="211M",
                                     gpu_hours=_H_UMST_BIG),
    # --- TranSFormer table 3: WMT16 En-Ro ------------------------------------------------------
    "sf-t3-transformer-sf-base": _row("TranSFormer", "3", "TranSFormer (hidden 32) base", "wmt16_en_ro",
                                      "transformer_sf_base", 35.40, params="59M", gpu_hours=_H_RO),
    # --- MSC (Wei et al., ACL 2020), table 4: WMT14 En-De --------------------------------------
    "msc-t4-transformer-base": _row("MSC", "4", "Transformer base", "wmt14_en_de", "transformer_wmt_en_de", 27.44,
                                    params="63M", gpu_hours=_H_MSC),
    "msc-t4-msc-6l-base": _row("MSC", "4", "MSC, 6 layers (6x1) base", "wmt14_en_de", "msc_base", 27.68,
                               params="73M", gpu_hours=_H_MSC),
    "msc-t4-msc-36l-base": _row("MSC", "4", "MSC, 36 layers (6x6) base", "wmt14_en_de", "msc_base", 29.71,
                                params="215M", gpu_hours=_H_MSC),
    "msc-t4-msc-48l-base": _row("MSC", "4", "MSC, 48 layers (6x8) base", "wmt14_en_de", "msc_base", 30.19,
                                params="272M", gpu_hours=_H_MSC),
    "msc-t4-transformer-big": _row("MSC", "4", "Transformer big", "wmt14_en_de", "transformer_vaswani_wmt_en_de_big",
                                   28.86, params="211M", gpu_hours=_H_MSC_BIG, average="epoch:20"),
    "msc-t4-msc-6l-big": _row("MSC", "4", "MSC, 6 layers (6x1) big", "wmt14_en_de", "msc_big", 29.17, params="286M",
                              gpu_hours=_H_MSC_BIG, average="epoch:20"),
    "msc-t4-msc-18l-big": _row("MSC", "4", "MSC, 18 layers (6x3) big", "wmt14_en_de", "msc_big", 30.56,
                               params="512M", gpu_hours=_H_MSC_BIG, average="epoch:20"),
    # --- Unified Transformer / Prime (Zhao et al.), table 1: WMT14 En-De big ---------------------
    "prime-t1-dynamicconv-big": _row("Prime", "1", "DynamicConv big, re-implemented by the Prime authors",
                                     "wmt14_en_de", "lightconv_wmt_en_de_big", 29.4, params="213M", gpus=4,
                                     gpu_hours=_H_PRIME, lenpen=0.5, average="epoch:10"),
    "prime-t1-prime-simple-big": _row("Prime", "1", "Unified Transformer (Prime-simple) big", "wmt14_en_de",
                                      "prime_simple_big", 29.8, params="233M", gpus=4, gpu_hours=_H_PRIME,
                                      lenpen=0.5, average="epoch:10"),
    "prime-t1-prime-big": _row("Prime", "1", "Unified Transformer (Prime) big", "wmt14_en_de", "prime_big", 29.9,
                               params="243M", gpus=4, gpu_hours=_H_PRIME, lenpen=0.5, average="epoch:10"),
    # --- Prime table 2: the paper's own base model (prime_base, 12+12 layers, d 384), IWSLT14 De-En only ----
    # (the paper has no WMT base row); beam 5 and lenpen 1 as the paper states for IWSLT De-En (sec. 3.1.3)
    "prime-t2-prime-base": _row("Prime", "2", "Unified Transformer (Prime) base", "iwslt14_de_en", "prime_base",
                                36.3, params="49M", gpus=1, gpu_hours="stated: 2-3 hours on 1 RTX 2080Ti", beam=5,
                                lenpen=1.0, average="epoch:10"),
    # --- Multi30k En-De (docs/multi30k.md): real language at Transformer-tiny size, 1 GPU ----------
    # Only the transformer row has a published number (Wu et al. 2021, Revisit-MMT: tokenized BLEU on
    # test_2016_flickr); scripts/multi30k_table.py trains, decodes and tabulates these rows.
    **{row: _row("Multi30k", "-", model, "multi30k_en_de", arch, bleu, gpus=1, gpu_hours="<1 GPU-h (tiny)", beam=5,
                 lenpen=1.0, average="epoch:5")
       for row, model, arch, bleu in [
           ("m30k-transformer", "Transformer-tiny (post-norm)", "transformer", 41.02),
           ("m30k-transformer-prenorm", "Transformer-tiny (pre-norm)", "transformer", None),
           ("m30k-umst", "UMST tiny", "umst_base", None),
           ("m30k-umst-noparse", "UMST tiny, no phrase edges", "umst_base", None),
           ("m30k-umst-random-phrase", "UMST tiny, random phrase adjacency", "umst_base", None),
           ("m30k-transformer-sf", "TranSFormer tiny", "transformer_sf_base", None),
           ("m30k-msc", "MSC tiny (4 blocks)", "msc_iwslt_de_en", None),
           ("m30k-msmsa", "MSMSA tiny", "msmsa_base", None),
           ("m30k-prime", "Prime tiny", "prime_base", None),
           ("m30k-prime-simple", "Prime-simple tiny", "prime_simple_base", None)]},
}


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
