"""A synthetic parallel corpus with Multi30k's sentence lengths, binarized for every architecture.

Random sentences whose (source, target) lengths in subword tokens are Multi30k's (``multi30k_lengths.json``:
the 1,000 test_2016_flickr pairs), over a vocabulary of ~10,000 subword types in subword-nmt style (words of
1-3 pieces, ``@@`` on every piece but a word's last, so word boundaries exist), with a gold dependency tree
of every source sentence as CoNLL-U; then fairseq-preprocess (``--joined-dictionary``) and ``umst-preprocess
--parser conllu``, in this process (with ``--workers`` > 1 umst-preprocess runs at the same time in a forked one),
write one data-bin that every arch loads under ``--task multiscale_translation`` and stock fairseq loads under
``--task translation``. The words mean nothing: the corpus is for measuring speed with realistic batches
(fairseq-train's words/s, fairseq-generate's sentences/s), not for learning anything.

* Lengths: each split draws its pairs from successive seeded permutations of the file's pairs, so a split of
  1,000 sentences has exactly Multi30k's test length pairs and 29,000 (the size of Multi30k's train) has each
  of them 29 times.
  ``--lengths wmt14`` draws them instead from a stand-in for WMT14 En-De's lengths after BPE (:data:`WMT14`:
  log-normal source lengths of mean 28 tokens with a tail to 250, targets about 5% longer, ratio at most 1.5).
* Vocabulary: ``--vocab`` dictionary entries (default 10,000) = fairseq's 4 specials + the types. The first
  20% of the types are shared by both languages, then 40% source-only and 40% target-only; each language draws
  its pieces by a Zipf law (p ~ 1/rank) over its own types. A word has 1 piece (80%), 2 (15%) or 3 (5%); a
  type is a continuation piece (``xx@@``) or a word-final piece. ``dict.txt`` lists every type (ordered by
  their count in train, as fairseq's dictionary is), so the data-bin's vocabulary is the same whatever the
  split sizes, and fairseq-preprocess reads it with ``--srcdict``.
* Trees: the root is a random word; every other word, taken in a random order, attaches to a random word
  already in the tree (any shape, non-projective too), with a random UD relation.
* Deterministic: each split has its own random stream (``seed`` and the split's name), so the test split is the
  same whatever the size of train; two runs with the same arguments write the same files.

Layout: ``OUT/raw/{split}.{src,tgt}`` (BPE text), ``OUT/raw/{split}.src.conllu``, ``OUT/raw/dict.txt``, and the
data-bin ``OUT/data-bin`` (fairseq's ``{split}.src-tgt.{src,tgt}.{bin,idx}``, ``dict.{src,tgt}.txt``, and
umst-preprocess's side files).

    python -m benchmarks synthetic-corpus OUT                      # 29,000 / 1,014 / 1,000 sentences
    python -m benchmarks synthetic-corpus OUT --train 0 --test 200 --workers 4
"""
import argparse
import collections
import json
import logging
import os
import random
import shutil
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

LENGTHS = os.path.join(HERE, "multi30k_lengths.json")
SRC, TGT = "src", "tgt"
SPLITS = ("train", "valid", "test")
DEFAULT_SIZES = dict(train=29000, valid=1014, test=1000)  # Multi30k's train, valid and test_2016_flickr
N_SPECIALS = 4  # fairseq's <s>, <pad>, </s>, <unk>
SHARED, SOURCE_ONLY = 0.2, 0.4  # shares of the types (the rest is target-only)
WORD_PIECES = ((1, 0.80), (2, 0.15), (3, 0.05))  # pieces per word
CONTINUATION_EVERY = 4  # every 4th type is a continuation piece (``xx@@``)
RELATIONS = ("nsubj", "obj", "iobj", "obl", "advmod", "amod", "det", "nmod", "case", "compound", "conj", "cc",
             "mark", "aux", "cop", "punct", "nummod", "acl", "advcl", "xcomp")
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def read_length_pairs(path=LENGTHS):
    """The file's (source, target) token counts, one pair per sentence."""
    with open(path) as f:
        return [tuple(p) for p in json.load(f)["pairs"]]


def type_name(i):
    """A distinct pronounceable name per type: 1 syllable for the first 70 types, 2 for the next 4,900, then 3."""
    n, base = 1, len(_SYLLABLES)
    while i >= base ** n:
        i -= base ** n
        n += 1
    out = []
    for _ in range(n):
        i, d = divmod(i, base)
        out.append(_SYLLABLES[d])
    return "".join(out)


class Language:
    """One side's pieces: word-final and continuation types, each pool with Zipf cumulative weights."""

    def __init__(self, types):
        final, cont = [], []
        for rank, i in enumerate(types):
            (cont if i % CONTINUATION_EVERY == CONTINUATION_EVERY - 1 else final).append((i, 1.0 / (rank + 1)))
        self.final, self.final_cw = self._pool(final)
        self.cont, self.cont_cw = self._pool(cont)

    @staticmethod
    def _pool(entries):
        ids, cw, total = [], [], 0.0
        for i, w in entries:
            total += w
            ids.append(i)
            cw.append(total)
        return ids, cw

    def sentence(self, rng, n_pieces):
        """``n_pieces`` type ids in words: a list of words, each a list of type ids (the last one word-final)."""
        sizes, left = [], n_pieces
        while left:
            r, k = rng.random(), WORD_PIECES[-1][0]
            for pieces, p in WORD_PIECES:
                if r < p:
                    k = pieces
                    break
                r -= p
            k = min(k, left)
            sizes.append(k)
            left -= k
        conts = rng.choices(self.cont, cum_weights=self.cont_cw, k=n_pieces - len(sizes))
        finals = rng.choices(self.final, cum_weights=self.final_cw, k=len(sizes))
        words, c = [], 0
        for k, final in zip(sizes, finals):
            words.append(conts[c:c + k - 1] + [final])
            c += k - 1
        return words


def languages(n_types):
    """(source, target) Languages over ``n_types`` types: shared types first, then each side's own."""
    shared = int(n_types * SHARED)
    source_end = shared + int(n_types * SOURCE_ONLY)
    src = Language(list(range(source_end)))
    tgt = Language(list(range(shared)) + list(range(source_end, n_types)))
    return src, tgt


def split_lengths(rng, pairs, n):
    """``n`` (source, target) length pairs: the file's pairs in successive random orders."""
    out = []
    while len(out) < n:
        order = list(pairs)
        rng.shuffle(order)
        out.extend(order[:n - len(out)])
    return out


# A stand-in for WMT14 En-De's sentence lengths after joint BPE (the training set of fairseq's
# prepare-wmt14en2de.sh, cleaned to 1-250 tokens at a length ratio of at most 1.5): the source length is
# log-normal with mean 28 tokens and sigma 0.6 (median 23, 99th percentile about 95, 99.9th about 145, a tail
# that reaches 250 in some tens of thousands of sentences), cut to 1-250; the target is the source times a
# log-normal ratio (mu 0.05, sigma 0.15: German's BPE runs about 5% longer), redrawn outside 1/1.5-1.5. Chosen
# to match those published figures, not read off the corpus.
WMT14 = "wmt14"
WMT14_MEAN, WMT14_SIGMA, WMT14_RATIO_MU, WMT14_RATIO_SIGMA, WMT14_MAX, WMT14_MAX_RATIO = 28.0, 0.6, 0.05, 0.15, 250, 1.5


def wmt14_pair(rng):
    """One (source, target) length pair of the WMT14 stand-in distribution (see :data:`WMT14`)."""
    import math

    mu = math.log(WMT14_MEAN) - WMT14_SIGMA ** 2 / 2
    while True:
        s = round(math.exp(rng.gauss(mu, WMT14_SIGMA)))
        if 1 <= s <= WMT14_MAX:
            break
    while True:
        ratio = math.exp(rng.gauss(WMT14_RATIO_MU, WMT14_RATIO_SIGMA))
        if 1 / WMT14_MAX_RATIO <= ratio <= WMT14_MAX_RATIO:
            return s, min(WMT14_MAX, max(1, round(s * ratio)))


def draw_lengths(rng, lengths, n):
    """``n`` (source, target) length pairs of ``lengths``: :data:`WMT14` (drawn from that distribution) or a JSON
    file's pairs (:func:`split_lengths`)."""
    if lengths == WMT14:
        return [wmt14_pair(rng) for _ in range(n)]
    return split_lengths(rng, read_length_pairs(lengths), n)


def random_tree(rng, n_words):
    """Heads (1-based, 0 = root) of a random dependency tree over ``n_words`` words, and their relations."""
    rand = rng.random
    order = sorted(range(1, n_words + 1), key=lambda _: rand())
    heads = [0] * (n_words + 1)
    for j in range(1, n_words):
        heads[order[j]] = order[int(rand() * j)]
    rels = ["root" if heads[w] == 0 else RELATIONS[int(rand() * len(RELATIONS))] for w in range(1, n_words + 1)]
    return heads[1:], rels


def write_corpus(raw_dir, sizes=None, seed=1, vocab=10000, lengths=LENGTHS):
    """Write ``{split}.{src,tgt}`` (subword-nmt text), ``{split}.src.conllu`` and ``dict.txt`` into ``raw_dir``.

    ``sizes``: split -> sentences (default :data:`DEFAULT_SIZES`; 0 skips the split). Returns the splits
    written, in order."""
    from umst_plugin.toy import conllu_block

    sizes = dict(DEFAULT_SIZES, **(sizes or {}))
    n_types = vocab - N_SPECIALS
    if n_types < 100:
        raise ValueError(f"--vocab {vocab}: expected at least {100 + N_SPECIALS} entries")
    names = [type_name(i) + ("@@" if i % CONTINUATION_EVERY == CONTINUATION_EVERY - 1 else "")
             for i in range(n_types)]
    src_lang, tgt_lang = languages(n_types)
    os.makedirs(raw_dir, exist_ok=True)
    counts = {split: collections.Counter() for split in SPLITS}
    written = []
    for split in SPLITS:
        n = sizes.get(split, 0)
        if not n:
            continue
        written.append(split)
        rng = random.Random(f"{seed}-{split}")
        counter = counts[split]
        with open(os.path.join(raw_dir, f"{split}.{SRC}"), "w", encoding="utf-8") as fs, \
                open(os.path.join(raw_dir, f"{split}.{TGT}"), "w", encoding="utf-8") as ft, \
                open(os.path.join(raw_dir, f"{split}.{SRC}.conllu"), "w", encoding="utf-8") as fc:
            src_lines, tgt_lines, blocks = [], [], []
            for k, (s_len, t_len) in enumerate(draw_lengths(rng, lengths, n), start=1):
                src_words = src_lang.sentence(rng, s_len)
                tgt_words = tgt_lang.sentence(rng, t_len)
                src_ids = [i for w in src_words for i in w]
                tgt_ids = [i for w in tgt_words for i in w]
                counter.update(src_ids)
                counter.update(tgt_ids)
                src_lines.append(" ".join(names[i] for i in src_ids))
                tgt_lines.append(" ".join(names[i] for i in tgt_ids))
                forms = ["".join(names[i][:-2] if names[i].endswith("@@") else names[i] for i in w)
                         for w in src_words]
                heads, rels = random_tree(rng, len(forms))
                blocks.append(conllu_block([(j, f, h, r) for j, (f, h, r) in enumerate(zip(forms, heads, rels), 1)],
                                           f"{split}-{k}"))
            fs.write("\n".join(src_lines) + "\n")
            ft.write("\n".join(tgt_lines) + "\n")
            fc.write("".join(blocks))
    # the dictionary fairseq would build from train (every type listed, unseen ones with count 0), ordered by
    # count; without a train split, by the counts over the splits written
    counter = counts["train"] if sizes.get("train") else sum(counts.values(), collections.Counter())
    with open(os.path.join(raw_dir, "dict.txt"), "w", encoding="utf-8") as f:
        for i in sorted(range(n_types), key=lambda i: (-counter[i], i)):
            f.write(f"{names[i]} {counter[i]}\n")
    return written


def _fairseq_preprocess(argv):
    """fairseq-preprocess in this process (its log file handler removed afterwards)."""
    from fairseq import options
    from fairseq_cli import preprocess

    log = logging.getLogger("fairseq_cli.preprocess")
    before = list(log.handlers)
    try:
        preprocess.main(options.get_preprocessing_parser().parse_args(argv))
    finally:
        for handler in [h for h in log.handlers if h not in before]:
            log.removeHandler(handler)
            handler.close()


def _umst_preprocess(argv):
    from umst_plugin.preprocess import cli

    rc = cli.main(argv)
    if rc:
        raise SystemExit(rc)


def binarize(raw_dir, databin, splits=SPLITS, workers=1, dictionary=None):
    """fairseq-preprocess (the joined dictionary ``dictionary``, default ``raw_dir/dict.txt``; ``workers``
    processes) and umst-preprocess ``--parser conllu`` of ``raw_dir``'s splits into ``databin`` (an existing one is
    replaced), in this process; with ``workers`` > 1 umst-preprocess runs at the same time in a forked process.
    umst-preprocess writes into a folder of its own whose files then join the data-bin, checked against fairseq's
    binarized source as the task checks them on load."""
    import multiprocessing

    from fairseq.data import indexed_dataset

    from umst_plugin.data.side_files import HEADS, WORD_IDS, check_side_alignment, load_side, side_prefix_of

    side_dir = databin.rstrip(os.sep) + ".side"
    for path in (databin, side_dir):
        if os.path.isdir(path):
            shutil.rmtree(path)
    prefs = []
    for split in splits:
        prefs += [f"--{split}pref", os.path.join(raw_dir, split)]
    langs = ["--source-lang", SRC, "--target-lang", TGT]
    umst_argv = langs + prefs + ["--destdir", side_dir, "--parser", "conllu", "--no-progress", "--no-check-binarized"]
    child = None
    if workers > 1:
        child = multiprocessing.get_context("fork").Process(target=_umst_preprocess, args=(umst_argv,))
        child.start()
    try:
        _fairseq_preprocess(langs + prefs + ["--destdir", databin, "--joined-dictionary", "--srcdict",
                                             dictionary or os.path.join(raw_dir, "dict.txt"),
                                             "--workers", str(workers)])
    finally:
        if child is not None:
            child.join()
    if child is None:
        _umst_preprocess(umst_argv)
    elif child.exitcode:
        raise RuntimeError(f"umst-preprocess failed (exit code {child.exitcode}) on {raw_dir}")
    for name in sorted(os.listdir(side_dir)):
        os.replace(os.path.join(side_dir, name), os.path.join(databin, name))
    os.rmdir(side_dir)
    for split in splits:
        prefix = side_prefix_of(databin, split, SRC, TGT, "mmap")
        source = indexed_dataset.MMapIndexedDataset(prefix)  # (its sizes are a view of its mmap: keep it alive)
        check_side_alignment(prefix, source.sizes, load_side(prefix, WORD_IDS), load_side(prefix, HEADS))
    return databin


def build(out_dir, sizes=None, seed=1, vocab=10000, workers=1, lengths=LENGTHS, dictionary=None):
    """Write the corpus into ``out_dir/raw`` and binarize it into ``out_dir/data-bin`` (with ``dictionary``, that
    dictionary instead of the corpus's own: another corpus's, so that the same checkpoints load); returns the
    data-bin."""
    raw = os.path.join(out_dir, "raw")
    splits = write_corpus(raw, sizes, seed, vocab, lengths)
    return binarize(raw, os.path.join(out_dir, "data-bin"), splits, workers, dictionary)


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", help="where raw/ and data-bin/ go (created; an existing data-bin is replaced)")
    for split in SPLITS:
        p.add_argument(f"--{split}", type=int, default=DEFAULT_SIZES[split],
                       help=f"{split} sentences (default {DEFAULT_SIZES[split]:,}; 0 skips the split)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--vocab", type=int, default=10000,
                   help="dictionary entries, fairseq's 4 specials included (default 10,000)")
    p.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers")
    p.add_argument("--lengths", default=LENGTHS,
                   help=f"'{WMT14}' (a stand-in for WMT14 En-De's BPE lengths: mean 28 source tokens, a tail to 250), "
                        "or a JSON file with 'pairs' of (source, target) token counts (default: Multi30k's test set)")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    start = time.time()
    databin = build(args.out_dir, {s: getattr(args, s) for s in SPLITS}, args.seed, args.vocab, args.workers,
                    args.lengths)
    print(f"synthetic corpus: {databin} ({', '.join(f'{s} {getattr(args, s):,}' for s in SPLITS)} sentences, "
          f"{args.vocab:,} dictionary entries) in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
