"""A deterministic toy corpus whose translation depends on multiscale structure.

The source language ("Kelan") is SVO with Latin-script compounds and a plural
suffix; the target language ("Moru") is SOV, head-final, and marks agreement:

* Compound nouns: the source writes two roots as one word (``talo`` +
  ``vesi`` -> ``talovesi``); the target writes the translated roots as two
  words in reverse order. After BPE, compounds and plurals are multi-piece
  words, so the word scale matters.
* Gender/number agreement along dependency arcs: every noun has a lexical
  gender (visible in the target only). Target adjectives and determiners take
  the gender+number suffix of their *head noun*, and the target verb takes the
  suffix of its *subject* -- which may be separated from the verb by adjectives
  and an ``of``-phrase whose noun has a different gender. Getting it right
  requires knowing the dependency head, not the nearest noun.
* Reordering of phrases: objects move before the verb, modifiers after their
  head noun, ``of``-phrases before the noun they modify.

``write_toy_corpus`` writes, for each split, ``{split}.tok.kel`` /
``{split}.tok.mor`` (word-tokenized) and ``{split}.kel.conllu`` with the gold
dependency tree of every source sentence (UD relations: det, amod, nsubj, obj,
nmod, case, root). ``bpe_toy_corpus`` then learns a joint subword-nmt BPE and
writes ``{split}.kel`` / ``{split}.mor``, so ``--trainpref DIR/train`` works for
both fairseq-preprocess and umst-preprocess.
"""
import argparse
import os
import random

SRC, TGT = "kel", "mor"

# (source root, target root, gender)
NOUN_ROOTS = [
    ("talo", "dum", "m"), ("vesi", "aqu", "f"), ("kivi", "lap", "m"), ("puu", "arb", "f"),
    ("mets", "silv", "f"), ("kala", "pisk", "m"), ("lintu", "av", "f"), ("koira", "kan", "m"),
    ("kissa", "fel", "f"), ("tie", "vi", "f"), ("joki", "flum", "m"), ("vuori", "mont", "m"),
    ("kuu", "lun", "f"), ("aurin", "sol", "m"), ("tuuli", "vent", "m"), ("lumi", "niv", "f"),
    ("sade", "pluv", "f"), ("kirja", "libr", "m"), ("poika", "puer", "m"), ("tytto", "puell", "f"),
    ("mies", "vir", "m"), ("nainen", "femin", "f"), ("laiva", "nav", "f"), ("meri", "mar", "m"),
    ("kukka", "flor", "m"), ("ovi", "port", "f"), ("tuli", "ign", "m"), ("maa", "terr", "f"),
]
ADJECTIVES = [
    ("iso", "magn"), ("pieni", "parv"), ("vanha", "vet"), ("uusi", "nov"), ("musta", "nigr"),
    ("valko", "alb"), ("nopea", "celer"), ("hidas", "tard"), ("kaunis", "pulkr"), ("kylma", "frigid"),
    ("lammin", "calid"), ("pitka", "long"),
]
VERBS = [
    ("nakee", "vid"), ("ottaa", "cap"), ("antaa", "don"), ("kantaa", "port"), ("rakastaa", "am"),
    ("etsii", "quaer"), ("loytaa", "inven"), ("syo", "ed"), ("tuntee", "sent"), ("kuulee", "aud"),
]
DETERMINERS = [("se", "il"), ("yksi", "un"), ("tama", "hik")]
OF_SRC, OF_TGT = "ko", "de"
PLURAL_SRC = "t"  # appended to the noun and the determiner in the source
# Target agreement suffixes by (gender, number).
AGREE = {("m", "sg"): "o", ("f", "sg"): "a", ("m", "pl"): "i", ("f", "pl"): "e"}


class _Node:
    __slots__ = ("form", "target", "rel", "head", "index")

    def __init__(self, form, target, rel, head=None):
        self.form, self.target, self.rel, self.head, self.index = form, target, rel, head, None


def _noun_phrase(rng, rel, depth):
    """Return (source nodes in order, head node, target words, gender, number)."""
    number = "pl" if rng.random() < 0.35 else "sg"
    if rng.random() < 0.45:  # compound: two roots, one source word
        (s1, t1, _), (s2, t2, gender) = rng.sample(NOUN_ROOTS, 2)
        noun_src, noun_tgt = s1 + s2, [t2, t1]
    else:
        s2, t2, gender = rng.choice(NOUN_ROOTS)
        noun_src, noun_tgt = s2, [t2]
    agree = AGREE[(gender, number)]
    head = _Node(noun_src + (PLURAL_SRC if number == "pl" else ""), None, rel)
    noun_tgt = noun_tgt[:-1] + [noun_tgt[-1] + agree + ("s" if number == "pl" else "")]
    det_src, det_tgt = rng.choice(DETERMINERS)
    det = _Node(det_src + (PLURAL_SRC if number == "pl" else ""), None, "det", head)
    adjs = [_Node(a[0], a[1] + agree, "amod", head) for a in rng.sample(ADJECTIVES, rng.choice([0, 0, 1, 1, 2]))]
    nodes = [det] + adjs + [head]
    target = noun_tgt + [a.target for a in adjs] + [det_tgt + agree]
    if depth == 0 and rng.random() < 0.4:  # "of"-phrase after the noun: X ko Y  ->  Y-de X
        of_nodes, of_head, of_target, _, _ = _noun_phrase(rng, "nmod", depth + 1)
        of_head.head = head
        case = _Node(OF_SRC, None, "case", of_head)
        nodes = nodes + [case] + of_nodes
        target = of_target + [OF_TGT] + target
    return nodes, head, target, gender, number


def make_sentence(rng):
    """One (source words, target words, conllu rows) triple."""
    subj_nodes, subj, subj_tgt, gender, number = _noun_phrase(rng, "nsubj", 0)
    verb_src, verb_tgt = rng.choice(VERBS)
    verb = _Node(verb_src, None, "root")
    subj.head = verb
    obj_nodes, obj, obj_tgt, _, _ = _noun_phrase(rng, "obj", 0)
    obj.head = verb
    nodes = subj_nodes + [verb] + obj_nodes
    for i, node in enumerate(nodes, start=1):
        node.index = i
    rows = []
    for node in nodes:
        head = 0 if node.head is None else node.head.index
        rows.append((node.index, node.form, head, node.rel))
    target = subj_tgt + obj_tgt + [verb_tgt + AGREE[(gender, number)]]
    return [n.form for n in nodes], target, rows


def conllu_block(rows, sent_id):
    lines = [f"# sent_id = {sent_id}", "# text = " + " ".join(r[1] for r in rows)]
    for idx, form, head, rel in rows:
        lines.append(f"{idx}\t{form}\t_\t_\t_\t_\t{head}\t{rel}\t_\t_")
    return "\n".join(lines) + "\n\n"


def write_toy_corpus(out_dir, seed=1, n_train=3000, n_valid=300, n_test=300):
    """Write {split}.tok.{kel,mor} and {split}.kel.conllu into out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(seed)
    seen = set()
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        with open(os.path.join(out_dir, f"{split}.tok.{SRC}"), "w", encoding="utf-8") as fs, \
                open(os.path.join(out_dir, f"{split}.tok.{TGT}"), "w", encoding="utf-8") as ft, \
                open(os.path.join(out_dir, f"{split}.{SRC}.conllu"), "w", encoding="utf-8") as fc:
            written = 0
            while written < n:
                src, tgt, rows = make_sentence(rng)
                key = " ".join(src)
                if key in seen:  # keep valid/test disjoint from train
                    continue
                seen.add(key)
                written += 1
                fs.write(key + "\n")
                ft.write(" ".join(tgt) + "\n")
                fc.write(conllu_block(rows, f"{split}-{written}"))
    return out_dir


def bpe_toy_corpus(out_dir, merges=400, splits=("train", "valid", "test")):
    """Learn a joint subword-nmt BPE on train and write {split}.{kel,mor}.

    Few merges on purpose: compounds and plurals stay multi-piece words.
    """
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    codes = os.path.join(out_dir, "bpe.codes")
    with open(codes, "w", encoding="utf-8") as out:
        lines = []
        for lang in (SRC, TGT):
            with open(os.path.join(out_dir, f"train.tok.{lang}"), encoding="utf-8") as f:
                lines.extend(f)
        learn_bpe(lines, out, merges, min_frequency=2)
    with open(codes, encoding="utf-8") as f:
        bpe = BPE(f)
    for split in splits:
        for lang in (SRC, TGT):
            with open(os.path.join(out_dir, f"{split}.tok.{lang}"), encoding="utf-8") as fin, \
                    open(os.path.join(out_dir, f"{split}.{lang}"), "w", encoding="utf-8") as fout:
                for line in fin:
                    fout.write(bpe.process_line(line))
    return codes


def get_parser():
    parser = argparse.ArgumentParser(
        prog="umst-toy-corpus",
        description="Write the bundled toy parallel corpus (Kelan->Moru) with gold CoNLL-U parses, "
        "then a joint subword-nmt BPE of it.")
    parser.add_argument("out_dir", help="directory to write into (created if missing)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    parser.add_argument("--train", type=int, default=3000, help="training pairs (default: 3000)")
    parser.add_argument("--valid", type=int, default=300, help="validation pairs (default: 300)")
    parser.add_argument("--test", type=int, default=300, help="test pairs (default: 300)")
    parser.add_argument("--bpe-merges", type=int, default=400,
                        help="joint BPE merges; 0 skips BPE (default: 400)")
    return parser


def main(argv=None):
    args = get_parser().parse_args(argv)
    write_toy_corpus(args.out_dir, args.seed, args.train, args.valid, args.test)
    if args.bpe_merges > 0:
        bpe_toy_corpus(args.out_dir, args.bpe_merges)
    print(f"wrote toy corpus to {args.out_dir}")


if __name__ == "__main__":
    main()
