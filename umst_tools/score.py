#!/usr/bin/env python3
"""BLEU from a fairseq-generate output, as the WMT recipes report it (used by evaluate.sh).

* Tokenized BLEU, multi-bleu.perl style: case-sensitive corpus BLEU over the
  Moses-tokenized hypotheses (after --remove-bpe) and the Moses-tokenized
  reference, whitespace tokens, no smoothing (as MSC, TranSFormer and Prime say they score). For En-De with
  compound splitting as in fairseq's compound_split_bleu.sh / tensor2tensor's get_ende_bleu.sh
  (``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`` on both sides): their WMT14 En-De convention, which none of the five
  papers mentions.
* Detokenized sacreBLEU: hypotheses detokenized with sacremoses, scored
  against the untokenized reference; prints sacrebleu's signature.

    python scripts/score.py --generate gen.out --tok-ref ref/test.tok.de --detok-ref ref/test.detok.de \\
        --lang de --compound-split --json results.json
"""
import argparse
import json
import os
import re
import sys

COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line):
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def read_generate(path):
    """(hypotheses, targets) in sample-id order from fairseq-generate output."""
    hyps, tgts = {}, {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("H-"):
                sid, _, text = line.rstrip("\n").split("\t", 2)
                hyps[int(sid[2:])] = text
            elif line.startswith("T-"):
                sid, text = line.rstrip("\n").split("\t", 1)
                tgts[int(sid[2:])] = text
    ids = sorted(hyps)
    if ids != list(range(len(ids))):
        raise SystemExit(f"{path}: hypotheses for {len(ids)} sentences but ids are not 0..{len(ids) - 1}")
    return [hyps[i] for i in ids], [tgts.get(i, "") for i in ids]


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def tokenized_bleu(hyps, refs, compound=False):
    """multi-bleu.perl: whitespace tokens, case-sensitive, brevity penalty, no smoothing."""
    import sacrebleu

    if compound:
        hyps, refs = [compound_split(h) for h in hyps], [compound_split(r) for r in refs]
    return sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(hyps, [refs])


def detokenize(lines, lang):
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang)
    return [detok.detokenize(line.split()) for line in lines]


def sacre_bleu(detok_hyps, refs):
    import sacrebleu

    metric = sacrebleu.metrics.BLEU()
    score = metric.corpus_score(detok_hyps, [refs])
    return score, str(metric.get_signature())


def score(generate, lang, tok_ref=None, detok_ref=None, compound=False):
    hyps, targets = read_generate(generate)
    refs = read_lines(tok_ref) if tok_ref else targets
    if len(refs) != len(hyps):
        raise SystemExit(f"{len(hyps)} hypotheses but {len(refs)} tokenized references ({tok_ref or 'T- lines'})")
    tok = tokenized_bleu(hyps, refs, compound)
    result = {"sentences": len(hyps), "tok_bleu": round(tok.score, 2), "tok_bleu_detail": str(tok),
              "compound_split": compound}
    detok_hyps = detokenize(hyps, lang)
    if detok_ref:
        drefs = read_lines(detok_ref)
        if len(drefs) != len(hyps):
            raise SystemExit(f"{len(hyps)} hypotheses but {len(drefs)} detokenized references ({detok_ref})")
        sb, signature = sacre_bleu(detok_hyps, drefs)
        result.update(sacrebleu=round(sb.score, 2), sacrebleu_detail=str(sb), sacrebleu_signature=signature)
    return result, detok_hyps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generate", required=True, help="fairseq-generate output (run with --remove-bpe)")
    p.add_argument("--lang", required=True, help="target language (detokenizer rules)")
    p.add_argument("--tok-ref", help="Moses-tokenized reference (default: the T- lines of the output)")
    p.add_argument("--detok-ref", help="untokenized reference for sacrebleu (omit to skip sacrebleu)")
    p.add_argument("--compound-split", action="store_true", help="En-De compound splitting before tokenized BLEU")
    p.add_argument("--json", help="write the scores (merged into an existing file) here")
    p.add_argument("--detok-out", help="write the detokenized hypotheses here")
    p.add_argument("--extra", action="append", default=[], metavar="KEY=VALUE", help="extra fields for --json")
    p.add_argument("--test-set", help="what the reference is (e.g. the full 3,003-sentence newstest2014): printed with "
                                      "the signature, 'test_set' in --json (sacreBLEU's signature names no test set "
                                      "when it scores files)")
    args = p.parse_args(argv)
    result, detok_hyps = score(args.generate, args.lang, args.tok_ref, args.detok_ref, args.compound_split)
    if args.test_set:
        result["test_set"] = args.test_set
    for item in args.extra:
        key, _, value = item.partition("=")
        result[key] = value
    if args.detok_out:
        with open(args.detok_out, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in detok_hyps)
    print(f"tokenized BLEU{' (compound split)' if args.compound_split else ''}: {result['tok_bleu_detail']}")
    if "sacrebleu" in result:
        print(f"sacreBLEU: {result['sacrebleu_detail']}")
        print(f"signature: {result['sacrebleu_signature']}" + (f" on {args.test_set}" if args.test_set else ""))
    if args.json:
        old = {}
        if os.path.exists(args.json):
            with open(args.json, encoding="utf-8") as f:
                old = json.load(f)
        old.update(result)
        with open(args.json + ".tmp", "w", encoding="utf-8") as f:
            json.dump(old, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
