"""The toy corpus laid out under the WMT file names, so the prepare scripts run from
their post-download stage in CI (``--raw-dir``)."""
import os
import shutil

from umst_plugin import toy
from umst_plugin.text_preprocessing import sha256_file as sha256  # noqa: F401  (used here and by tests)

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


# ---- Multi30k ----------------------------------------------------------------------------------

# (raw file stem, fairseq split, lines taken by default)
MULTI30K_FILES = [("train", "train", 300), ("val", "valid", 60), ("test_2016_flickr", "test", 40),
                  ("test_2017_flickr", "test1", 40), ("test_2017_mscoco", "test2", 30)]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The real raw files, beside a checkout (CI clones the repo with shared/ next to it).
SHARED_MULTI30K = os.path.join(ROOT, "..", "shared", "data", "multi30k")


def write_gz(path, lines):
    """Gzip ``lines`` reproducibly (no name, mtime 0), as the pinned release files are compressed."""
    import gzip

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write("".join(line + "\n" for line in lines).encode("utf-8"))


def read_gz(path, limit=None):
    import gzip

    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(out) >= limit:
                break
            out.append(line.rstrip("\n"))
    return out




def write_multi30k_standin(raw_dir, counts=None, shared_dir=SHARED_MULTI30K, seed=1):
    """The ten Multi30k raw files (``{stem}.{en,de}.gz``) in ``raw_dir``: the first lines of the real
    files when ``shared_dir`` holds them, else the toy corpus under those names.

    ``counts`` maps a fairseq split (train, valid, test, test1, test2) to its number of lines
    (default: 300 / 60 / 40 / 40 / 30). Returns (source, {split: lines}).
    """
    counts = {split: n for _, split, n in MULTI30K_FILES} | dict(counts or {})
    real = shared_dir and all(os.path.exists(os.path.join(shared_dir, f"{stem}.{lang}.gz"))
                              for stem, _, _ in MULTI30K_FILES for lang in ("en", "de"))
    if real:
        for stem, split, _ in MULTI30K_FILES:
            for lang in ("en", "de"):
                write_gz(os.path.join(raw_dir, f"{stem}.{lang}.gz"),
                         read_gz(os.path.join(shared_dir, f"{stem}.{lang}.gz"), counts[split]))
        return "shared", counts
    work = raw_dir + ".toy"
    n_test = counts["test"] + counts["test1"] + counts["test2"]
    toy.write_toy_corpus(work, seed, counts["train"], counts["valid"], n_test)
    for lang, toy_lang in (("en", toy.SRC), ("de", toy.TGT)):
        text = {split: _lines(os.path.join(work, f"{split}.tok.{toy_lang}")) for split in ("train", "valid", "test")}
        tests = text["test"]
        text["test"], text["test1"], text["test2"] = (tests[:counts["test"]],
                                                      tests[counts["test"]:counts["test"] + counts["test1"]],
                                                      tests[counts["test"] + counts["test1"]:])
        for stem, split, _ in MULTI30K_FILES:
            write_gz(os.path.join(raw_dir, f"{stem}.{lang}.gz"), text[split])
    shutil.rmtree(work)
    return "toy", counts


def write_multi30k_sources(path, raw_dir, url_prefix="file:///nonexistent", sha=None):
    """A MULTI30K_SOURCES list (scripts/multi30k-sources.txt's format) pinning the files of
    ``raw_dir`` by their sha256 (or ``sha[file]``)."""
    sha = dict(sha or {})
    lines = ["# stand-in Multi30k files (tests)", f"url-prefix {url_prefix}"]
    for stem, split, _ in MULTI30K_FILES:
        for lang in ("en", "de"):
            name = f"{stem}.{lang}.gz"
            lines.append(f"{name} {sha.get(name) or sha256(os.path.join(raw_dir, name))} {split}")
    _write(str(path), lines)
    return str(path)


MULTI30K_MERGES = 300  # toy BPE of the stand-in data-bin
STANDIN_RECORD = "standin.json"


def prepare_multi30k_standin(top):
    """scripts/prepare-multi30k.sh (lowercased, spaCy parser, 300 BPE merges) on the stand-in raw files written into
    ``top``/raw (``write_multi30k_standin``), work dir ``top``/work; what the tests read about the run (origin,
    counts, command, log) goes to ``top``/standin.json. Returns ``top``. Built once per test run
    (tests/conftest.py, ``multi30k_standin``): tests that change the work dir copy it first."""
    import json
    import subprocess

    import e2e

    raw, work = os.path.join(top, "raw"), os.path.join(top, "work")
    origin, counts = write_multi30k_standin(raw)
    sources = write_multi30k_sources(os.path.join(top, "sources.txt"), raw)
    cmd = ["bash", os.path.join(e2e.ROOT, "scripts", "prepare-multi30k.sh"), "--raw-dir", raw, "--work-dir", work,
           "--bpe-merges", str(MULTI30K_MERGES), "--parser", "spacy", "--parser-args",
           "--parser-model en_core_web_md", "--workers", "1"]
    proc = subprocess.run(cmd, env=e2e.recipe_env(MULTI30K_SOURCES=sources), cwd=e2e.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-6000:]}"
    with open(os.path.join(top, STANDIN_RECORD), "w", encoding="utf-8") as f:
        json.dump(dict(origin=origin, counts=counts, sources=str(sources), cmd=cmd, log=proc.stdout), f)
    return top


def multi30k_standin(top):
    """What ``prepare_multi30k_standin`` built in ``top``: raw, work, databin, sources, origin, counts, cmd, log."""
    import json

    with open(os.path.join(top, STANDIN_RECORD), encoding="utf-8") as f:
        made = json.load(f)
    work = os.path.join(top, "work")
    return dict(made, raw=os.path.join(top, "raw"), work=work,
                databin=os.path.join(work, "data-bin", f"multi30k_en_de_bpe{MULTI30K_MERGES}"))
