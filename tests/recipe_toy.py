"""The toy corpus laid out under the WMT file names, so the prepare scripts run from
their post-download stage in CI (``--raw-dir``)."""
import os
import shutil

from umst_plugin import toy

LAYOUTS = {
    # dataset: (target language, training corpus prefixes, valid sgm (src, ref), test sgm (src, ref))
    "wmt14-en-de": ("de", ["training/europarl-v7.de-en", "commoncrawl.de-en", "training/news-commentary-v9.de-en"],
                    ("test/newstest2013-src.en.sgm", "test/newstest2013-src.de.sgm"),
                    ("test-full/newstest2014-deen-src.en.sgm", "test-full/newstest2014-deen-ref.de.sgm")),
    "wmt16-en-ro": ("ro", ["training-parallel-ep-v8/europarl-v8.ro-en", "SETIMES.en-ro"],
                    ("dev/newsdev2016-enro-src.en.sgm", "dev/newsdev2016-enro-ref.ro.sgm"),
                    ("test/newstest2016-enro-src.en.sgm", "test/newstest2016-enro-ref.ro.sgm")),
}


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def _write(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def _sgm(path, lines, kind):
    segs = [f'<seg id="{i}">{line}</seg>' for i, line in enumerate(lines, 1)]
    _write(path, [f'<{kind}set setid="toy" srclang="any">', '<doc docid="toy" genre="news">', "<p>", *segs,
                  "</p>", "</doc>", f"</{kind}set>"])


def write_toy_wmt(dataset, raw_dir, conllu_dir, n_train=300, n_valid=30, n_test=30, seed=1):
    """Toy Kelan->Moru as English->German/Romanian under the dataset's extracted file names.

    The toy target gets one extra line with a long word in the first training corpus so the
    cleaning stage has something to drop (its CoNLL-U parse stays: cleaning must filter it).
    Returns the number of training pairs the cleaning stage should keep.
    """
    tgt, corpora, valid, test = LAYOUTS[dataset]
    work = raw_dir + ".toy"
    toy.write_toy_corpus(work, seed, n_train, n_valid, n_test)
    src_lines, tgt_lines = _lines(os.path.join(work, "train.tok.kel")), _lines(os.path.join(work, "train.tok.mor"))
    # Pair 0 becomes too unbalanced for clean-corpus-n's 1.5 ratio.
    tgt_lines[0] = " ".join(tgt_lines[0].split() * 3)
    chunk = -(-len(src_lines) // len(corpora))
    for k, prefix in enumerate(corpora):
        _write(os.path.join(raw_dir, f"{prefix}.en"), src_lines[k * chunk:(k + 1) * chunk])
        _write(os.path.join(raw_dir, f"{prefix}.{tgt}"), tgt_lines[k * chunk:(k + 1) * chunk])
    for split, (src_sgm, ref_sgm) in (("valid", valid), ("test", test)):
        _sgm(os.path.join(raw_dir, src_sgm), _lines(os.path.join(work, f"{split}.tok.kel")), "src")
        _sgm(os.path.join(raw_dir, ref_sgm), _lines(os.path.join(work, f"{split}.tok.mor")), "ref")
    os.makedirs(conllu_dir, exist_ok=True)
    for split in ("train", "valid", "test"):
        shutil.copy(os.path.join(work, f"{split}.kel.conllu"), os.path.join(conllu_dir, f"{split}.en.conllu"))
    shutil.rmtree(work)
    return n_train - 1
