"""umst-preprocess at scale: vectorised BPE scan and writer, resumable chunks, shards + merge, bad inputs."""
import argparse
import os
import random

import numpy as np
import pytest

import e2e
from umst_plugin.preprocess import cli, parsers, text
from umst_plugin.preprocess.chunks import ChunkedParse, batches, parse_sentences, shard_range
from umst_plugin.preprocess.sidefiles import int_lines, write_mmap_index
from umst_plugin.preprocess.text import read_bpe_lines, scan_bpe, word_ids_from_pieces

from test_parsers import ENGLISH_BPE


# ---- the vectorised scan and writer -----------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["subword-nmt", "sentencepiece"])
def test_scan_bpe_matches_line_by_line(tmp_path, monkeypatch, scheme):
    rng = random.Random(0)
    pool = ["a", "b@@", "@@", "c@@", "&apos;", "x", "\u2581a", "\u2581b", "c", "\u2581", "é@@", "ü", "@", "a@"]
    lines = []
    for _ in range(700):
        line = "  ".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))
        lines.append((" " if rng.random() < 0.1 else "") + line + ("\t\r" if rng.random() < 0.1 else ""))
    path = tmp_path / "f"
    path.write_text("\n".join(lines), encoding="utf-8")  # no final newline
    monkeypatch.setattr(text, "BLOCK_BYTES", 997)  # many blocks, lines cut at block edges
    reference = [pieces for _, pieces in read_bpe_lines(path)]
    for start, stop in [(0, None), (5, 17), (100, 699), (690, None), (3, 3)]:
        scan = scan_bpe(path, scheme, start, stop)
        ref = reference[start:stop]
        assert scan.word_ids.tolist() == [i for p in ref for i in word_ids_from_pieces(p, scheme)]
        assert scan.n_tokens.tolist() == [len(p) for p in ref]
        assert scan.n_words.tolist() == [word_ids_from_pieces(p, scheme)[-1] for p in ref]
        assert scan.first_line == start + 1


def test_scan_bpe_unicode_whitespace_takes_the_exact_path(tmp_path):
    path = tmp_path / "f"
    path.write_text("a\u00a0b c@@ d\ne\u2009f\n", encoding="utf-8")  # str.split() splits on these too
    scan = scan_bpe(path, "subword-nmt")
    assert scan.word_ids.tolist() == [1, 2, 3, 3, 1, 2] and scan.n_tokens.tolist() == [4, 2]
    assert scan.n_words.tolist() == [3, 2]


def test_parser_words_of_a_line_range(tmp_path):
    """What a parser chunk reads (``iter_parser_words``, 0-based [start, stop)): its lines, numbered from 1, as
    words with the BPE markers joined and Moses' escapes undone."""
    path = tmp_path / "f"
    path.write_text("a@@ b c\nd &apos;e\nf\ng h@@ i\n", encoding="utf-8")
    assert list(text.iter_parser_words(path, "subword-nmt", 1, 3)) == [(2, ["d", "'e"]), (3, ["f"])]
    assert list(text.iter_parser_words(path, "subword-nmt", 3)) == [(4, ["g", "hi"])]
    assert [n for n, _ in text.iter_parser_words(path, "subword-nmt")] == [1, 2, 3, 4]


def test_count_lines_counts_a_last_line_without_its_newline(tmp_path, monkeypatch):
    """The line count that splits a file into shards (umst-preprocess --shard): str.splitlines()'s count, whether
    or not the last line ends with a newline, wherever the blocks it reads end."""
    monkeypatch.setattr(text, "BLOCK_BYTES", 3)  # block edges before, at and after newlines
    path = tmp_path / "f"
    for content in (b"", b"\n", b"ab\n", b"ab\ncd", b"ab\ncd\n", b"a\n\nb", b"abcdefg", b"abcde\n"):
        path.write_bytes(content)
        assert text.count_lines(path) == len(content.decode().splitlines()), content


def test_scan_bpe_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"a b\nc \xff d\n")
    with pytest.raises(ValueError, match=rf"{bad}:2: not valid UTF-8"):
        scan_bpe(bad, "subword-nmt")
    empty = tmp_path / "empty"
    empty.write_text("a b\nc\n  \nd\n")
    with pytest.raises(ValueError, match=rf"{empty}:3: empty line"):
        scan_bpe(empty, "subword-nmt")


def test_mmap_index_is_fairseqs(tmp_path):
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    sizes = [3, 1, 7, 2]
    write_mmap_index(tmp_path / "ours.idx", sizes)
    with MMapIndexedDataset.Index.writer(str(tmp_path / "theirs.idx"), np.int32) as w:
        w.write(sizes)
    assert (tmp_path / "ours.idx").read_bytes() == (tmp_path / "theirs.idx").read_bytes()


def test_int_lines_matches_str_formatting():
    assert int_lines(np.array([1, 1, 2, 3, 4]), [3, 2]) == "1 1 2\n3 4\n"
    assert int_lines(np.array([5]), [0, 1]) == "\n5\n"
    rng = np.random.default_rng(0)
    for high in (0, 9, 10, 99, 1000, 123456, 2 ** 33):
        sizes = rng.integers(1, 8, size=50)
        flat = rng.integers(0, high + 1, size=int(sizes.sum()))
        rows = np.split(flat, np.cumsum(sizes)[:-1])
        assert int_lines(flat, sizes) == "".join(" ".join(map(str, r.tolist())) + "\n" for r in rows)


def test_unicode_space_detection_matches_python():
    spaces = [chr(c) for c in range(128, 0x110000) if chr(c).isspace()]
    others = ["é", "\u201c", "\u2014", "\u200b", "\u1681", "\u3001", "\u2060", "a"]
    for ch in spaces + others:
        data = f"x{ch}y".encode("utf-8")
        assert text._has_unicode_space(np.frombuffer(data, np.uint8)) == (ch in spaces), repr(ch)


def test_shard_ranges_cover_on_chunk_boundaries():
    for n_lines, chunk, n in [(100, 10, 3), (7, 10, 3), (1001, 7, 8), (30, 10, 3)]:
        ranges = [shard_range(n_lines, chunk, i, n) for i in range(1, n + 1)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n_lines
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert all(a % chunk == 0 or a == n_lines for a, _ in ranges)


def test_parser_batches_hold_at_most_batch_size_sentences_and_batch_tokens_words():
    """--batch-size and --batch-tokens bound what the parser gets at once (its memory): consecutive batches, each
    full up to the first limit the next sentence would pass; a sentence longer than --batch-tokens alone."""
    sentences = [["w"] * n for n in (8, 3, 4, 2, 5, 1)]
    lengths = lambda batched: [[len(s) for s in b] for b in batched]  # noqa: E731
    assert lengths(batches(sentences, 2, 0)) == [[8, 3], [4, 2], [5, 1]]
    assert lengths(batches(sentences, 10, 6)) == [[8], [3], [4, 2], [5, 1]]
    assert lengths(batches(sentences, 2, 7)) == [[8], [3, 4], [2, 5], [1]]
    assert lengths(batches(sentences, 100, 0)) == [[8, 3, 4, 2, 5, 1]]


class _BatchRecordingParser(parsers.NoParser):
    """The ``none`` parser, keeping the size of each batch it was given."""

    def __init__(self, args=None):
        super().__init__(args)
        self.batches = []

    def parse(self, sentences):
        self.batches.append(len(sentences))
        return super().parse(sentences)


def test_a_chunk_reaches_the_parser_in_batches_of_batch_size_and_batch_tokens():
    """A chunk's sentences reach the parser ``--batch-size`` at a time (256 where it is unset or 0) and within
    ``--batch-tokens``; ``--max-words`` gives longer sentences the fallback graph."""
    sentences = [["w"] * n for n in (1, 2, 3, 4, 5)] * 120  # 600 sentences, 1,800 words

    def batch_sizes(**options):
        parser = _BatchRecordingParser()
        parses = parse_sentences(parser, sentences, argparse.Namespace(**options))
        assert len(parses) == len(sentences)
        return parser.batches, parses

    assert batch_sizes(batch_size=2)[0] == [2] * 300
    assert batch_sizes()[0] == batch_sizes(batch_size=None)[0] == batch_sizes(batch_size=0)[0] == [256, 256, 88]
    assert batch_sizes(batch_size=100, batch_tokens=9)[0] == [3, 2] * 120  # 1+2+3, then 4+5: a next word would pass 9
    recorded, parses = batch_sizes(batch_size=10, max_words=3)
    assert [p.fallback for p in parses[:5]] == [None, None, None, "too long", "too long"]
    assert recorded == [6] * 60  # of each 10 sentences, the parser sees the 6 within --max-words


def test_a_shard_removes_only_its_own_chunks_half_written_files(tmp_path):
    """Shards may share a work dir given by hand, and run at once: a shard starting up removes what a kill left of
    its own chunks (a ``.tmp-PID`` file is never whole), never a file another shard is writing now."""
    bpe = tmp_path / "train.en"
    bpe.write_text("a b\n" * 20)
    args = argparse.Namespace(parser="spacy", chunk_size=5)
    work = tmp_path / "work"
    first = ChunkedParse(args, str(bpe), "subword-nmt", 0, 10, str(work))  # chunks 0 and 1
    work.mkdir()
    killed, writing = work / "chunk-000001.tsv.tmp-111", work / "chunk-000002.tsv.tmp-222"  # the second shard's
    killed.write_text("0 1\tx y\t\n")
    writing.write_text("0 1\tx y\t\n")
    assert first.prepare() == [0, 1]
    assert not killed.exists() and writing.exists()


class _CountingBar:
    """A progress bar that keeps what it was told: one update per chunk result the run waited for."""

    def __init__(self, total, initial):
        self.updates = []

    def update(self, n):
        self.updates.append(n)

    def close(self):
        pass


def test_worker_pool_queues_a_bounded_window_and_stops_after_chunks(tmp_path, monkeypatch):
    """``--workers N``: a chunk's sentences are read from the BPE file only when fewer than 2N chunks wait for
    their results (a WMT split is never in memory at once); ``--stop-after-chunks K`` ends the pool after exactly
    K results; a rerun parses only the chunks missing and gives the arrays of a run in one process. The parser
    is ``none`` (every sentence's fallback graph): what is tested is the pool, which spawns its workers."""
    lines = [" ".join(f"w{i}x{j}" for j in range(1 + i % 5)) for i in range(60)]  # 60 lines: 9 chunks of 7
    bpe = tmp_path / "train.en"
    bpe.write_text("\n".join(lines) + "\n")
    drawn_after = []  # per chunk read: how many results had been waited for before it
    bars = []
    jobs = ChunkedParse._jobs

    def counting_jobs(self, todo):
        for job in jobs(self, todo):
            drawn_after.append(len(bars[-1].updates))
            yield job

    def progress(total, initial):
        bars.append(_CountingBar(total, initial))
        return bars[-1]

    monkeypatch.setattr(ChunkedParse, "_jobs", counting_jobs)

    def parse(work, workers, stop_after=None):
        args = argparse.Namespace(parser="none", chunk_size=7, workers=workers, stop_after_chunks=stop_after)
        drawn_after.clear()
        return ChunkedParse(args, str(bpe), "subword-nmt", 0, 60, str(tmp_path / work)).run(progress)

    reference = parse("serial", workers=1)
    assert drawn_after == [0, 1, 2, 3, 4, 5, 6, 7, 8]  # one process: each chunk parsed before the next is read

    whole = parse("pool", workers=2)
    assert drawn_after == [0, 0, 0, 0, 1, 2, 3, 4, 5]  # four chunks ahead of the oldest result, never more
    assert bars[-1].updates == [7] * 8 + [4]

    with pytest.raises(KeyboardInterrupt, match="after 2 chunks"):
        parse("stopped-serial", workers=1, stop_after=2)
    assert bars[-1].updates == [7, 7]  # one process stops after exactly K chunks too
    assert sorted(os.listdir(tmp_path / "stopped-serial")) == ["chunk-000000.tsv", "chunk-000001.tsv",
                                                                 "manifest.json"]

    with pytest.raises(KeyboardInterrupt, match="after 2 chunks"):
        parse("stopped", workers=2, stop_after=2)
    assert bars[-1].updates == [7, 7]
    done = sorted(name for name in os.listdir(tmp_path / "stopped") if name.endswith(".tsv"))
    assert "chunk-000000.tsv" in done and "chunk-000001.tsv" in done and len(done) < 9
    resumed = parse("stopped", workers=2)
    assert len(drawn_after) == 9 - len(done)  # the chunks written before the stop are not read again
    for arrays in (whole, resumed):
        assert arrays.heads.tolist() == reference.heads.tolist()
        assert arrays.sizes.tolist() == reference.sizes.tolist() == [1 + i % 5 for i in range(60)]
        assert arrays.labels == reference.labels

# ---- resume and shards with a real parser ------------------------------------------------------------

def _english_corpus(d, copies=5):
    """60 distinct lines of Moses-tokenized, BPE'd English."""
    lines = ENGLISH_BPE.splitlines()
    out = [f"{line[:-2]} , number {k} ." if k else line for k in range(copies) for line in lines]
    (d / "train.en").write_text("\n".join(out) + "\n")
    return out


def _files(d):
    return {name: (d / name).read_bytes() for name in sorted(os.listdir(d)) if not name.startswith(".")}


@pytest.fixture(scope="module")
def spacy_ok():
    e2e.skip_without_spacy_model()


@pytest.fixture(scope="module")
def english(tmp_path_factory, spacy_ok):
    """The corpus and one uninterrupted, unsharded spaCy run over it."""
    d = tmp_path_factory.mktemp("english")
    _english_corpus(d)
    args = ["-s", "en", "-t", "de", "--trainpref", str(d / "train"), "--parser", "spacy", "--no-check-binarized",
            "--no-progress", "--chunk-size", "7"]
    assert cli.main(args + ["--destdir", str(d / "full")]) == 0
    return d, args


@pytest.mark.slow  # two spawned parser processes, each importing fairseq and loading spaCy
def test_resume_after_interrupt_is_byte_identical(english, capsys, caplog):
    d, args = english
    dest = d / "resumed"
    # a previously written data-bin (no parse) that the interrupted run must leave untouched
    no_parse = [("none" if a == "spacy" else a) for a in args]
    assert cli.main(no_parse + ["--destdir", str(dest)]) == 0
    before = _files(dest)
    assert cli.main(args + ["--destdir", str(dest), "--stop-after-chunks", "3"]) == 130
    assert "rerun the same command to continue" in capsys.readouterr().err
    assert _files(dest) == before
    chunks = sorted(os.listdir(dest / ".umst-work" / "train.en"))
    assert chunks == ["chunk-000000.tsv", "chunk-000001.tsv", "chunk-000002.tsv", "manifest.json"]
    # a half-written chunk from the kill is never taken for a finished one
    (dest / ".umst-work" / "train.en" / "chunk-000003.tsv.tmp-999").write_text("0 0\tx x\t\n")
    with caplog.at_level("INFO", logger="umst_plugin.preprocess"):
        assert cli.main(args + ["--destdir", str(dest), "--workers", "2"]) == 0
    # 60 lines in chunks of 7: 9 chunks, of which the 3 done are not parsed again
    assert "parsing 6 chunk(s) in 2 worker processes" in caplog.text, caplog.text
    assert _files(dest) == _files(d / "full")
    assert _files(dest) != before
    assert not os.path.exists(dest / ".umst-work")


def test_changed_input_discards_stale_chunks(english, tmp_path, caplog):
    d, args = english
    src = tmp_path / "train.en"
    lines = _english_corpus(tmp_path)
    a = ["-s", "en", "-t", "de", "--trainpref", str(tmp_path / "train"), "--parser", "spacy",
         "--no-check-binarized", "--no-progress", "--chunk-size", "7", "--destdir", str(tmp_path / "bin")]
    assert cli.main(a + ["--stop-after-chunks", "1"]) == 130
    src.write_text("\n".join(lines[1:] + lines[:1]) + "\n")  # same size, other content -> new mtime
    os.utime(src, ns=(1, 1))
    with caplog.at_level("WARNING", logger="umst_plugin.preprocess"):
        assert cli.main(a) == 0
    assert "discarding chunks made with different inputs or settings (mtime_ns changed)" in caplog.text, caplog.text
    heads = (tmp_path / "bin" / "train.en.heads").read_text().splitlines()
    full = (d / "full" / "train.en.heads").read_text().splitlines()
    assert heads == full[1:] + full[:1]


def test_three_shards_merged_equal_unsharded(english):
    d, args = english
    text_dir = d / "shards"
    for i in (1, 2, 3):
        assert cli.main(args + ["--destdir", str(d / "unused"), "--text-dir", str(text_dir), "--shard", f"{i}/3"]) == 0
    names = sorted(os.listdir(text_dir))
    assert names == [f"train.en.shard{i}of3.{k}" for i in (1, 2, 3) for k in ("heads", "labels")]
    sizes = [len((text_dir / f"train.en.shard{i}of3.heads").read_text().splitlines()) for i in (1, 2, 3)]
    assert sum(sizes) == 60 and all(s % 7 == 0 for s in sizes[:-1]) and min(sizes) > 0
    merged = d / "merged"
    assert cli.main(args + ["--destdir", str(merged), "--text-dir", str(text_dir), "--merge-shards", "3"]) == 0
    ours = {k: v for k, v in _files(merged).items()}
    ours.update({k: v for k, v in _files(text_dir).items() if ".shard" not in k})
    assert ours == _files(d / "full")


def test_conllu_shards_merged_equal_unsharded(toy_raw, tmp_path):
    """--parser conllu with --shard: each shard takes the CoNLL-U sentences of its own lines (the file is read from
    its start, the lines before the shard skipped), and the merged shards equal an unsharded run byte for byte."""
    args = ["-s", e2e.SRC, "-t", e2e.TGT, "--trainpref", os.path.join(toy_raw, "train"), "--parser", "conllu",
            "--no-check-binarized", "--no-progress", "--chunk-size", "7"]
    assert cli.main(args + ["--destdir", str(tmp_path / "full")]) == 0
    shards = tmp_path / "shards"
    for i in (1, 2, 3):
        assert cli.main(args + ["--destdir", str(tmp_path / "unused"), "--text-dir", str(shards), "--shard",
                                f"{i}/3"]) == 0
    full_heads = (tmp_path / "full" / f"train.{e2e.SRC}.heads").read_text().splitlines()
    shard_heads = [(shards / f"train.{e2e.SRC}.shard{i}of3.heads").read_text().splitlines() for i in (1, 2, 3)]
    assert sum(shard_heads, []) == full_heads and all(len(h) % 7 == 0 for h in shard_heads[:-1])
    assert cli.main(args + ["--destdir", str(tmp_path / "merged"), "--text-dir", str(shards), "--merge-shards",
                            "3"]) == 0
    merged = _files(tmp_path / "merged")
    merged.update({k: v for k, v in _files(shards).items() if ".shard" not in k})
    assert merged == _files(tmp_path / "full")


def test_side_file_checks_name_the_parse_and_the_line(tmp_path):
    """The sidefiles checks on their own: the parse file an error names (the one given, else what made the
    parses), the line after the last of a longer CoNLL-U, the line of a labels file shorter than its heads,
    the words' check on by default, and a binarized source with no index taken as absent."""
    from umst_plugin.data.side_files import SideDataError
    from umst_plugin.preprocess.conllu_reader import SurfaceParse
    from umst_plugin.preprocess.sidefiles import (ParseArrays, check_against_binarized, check_parses,
                                                  parses_from_conllu, read_parse_text)

    bpe = tmp_path / "train.en"
    bpe.write_text("the dog@@ s bark\na cat\n")
    scan = scan_bpe(str(bpe), "subword-nmt")
    check_parses(scan, ParseArrays([2, 0, 3, 2, 0], [3, 2], ["det root x", "det root"]))  # heads up to the words
    parses = ParseArrays([2, 0, 7, 2, 0], [3, 2], ["det root x", "det root"], source="made by a parser")
    with pytest.raises(SideDataError) as info:
        check_parses(scan, parses)
    assert str(info.value).startswith("made by a parser:1: head 7 out of range")
    with pytest.raises(SideDataError) as info:
        check_parses(scan, parses, parse_path="shard1of2.heads")
    assert str(info.value).startswith("shard1of2.heads:1: head 7 out of range")

    def sentence(*forms):
        return SurfaceParse(list(forms), [0] + [1] * (len(forms) - 1), ["root"] + ["dep"] * (len(forms) - 1))

    good = [sentence("the", "dogs", "bark"), sentence("a", "cat")]
    assert parses_from_conllu(str(bpe), good, "t.conllu", "subword-nmt").sizes.tolist() == [3, 2]
    with pytest.raises(SideDataError) as info:
        parses_from_conllu(str(bpe), good + [sentence("more")], "t.conllu", "subword-nmt")
    assert str(info.value) == f"{bpe}:3: t.conllu has more sentences than the 2 lines of the BPE text"
    other = [sentence("the", "cats", "bark"), sentence("a", "cat")]
    with pytest.raises(SideDataError, match=r":1: word 2 is 'dogs' in the BPE text but 'cats' in t.conllu"):
        parses_from_conllu(str(bpe), other, "t.conllu", "subword-nmt")
    assert parses_from_conllu(str(bpe), other, "t.conllu", "subword-nmt", check_forms=False).sizes.tolist() == [3, 2]

    heads, labels = tmp_path / "s.heads", tmp_path / "s.labels"
    heads.write_text("2 0 2\n2 0\n")
    labels.write_text("det root x\n")
    with pytest.raises(SideDataError) as info:
        read_parse_text(str(heads), str(labels))
    assert str(info.value).startswith(f"{labels}:2: 1 lines but 2 in {heads}; expected one label line per head line")

    # fairseq cannot read a .bin without its .idx: the binarized check finds no source rather than failing on it
    prefix = tmp_path / "bin" / "train.en-de.en"
    prefix.parent.mkdir()
    (tmp_path / "bin" / "train.en-de.en.bin").write_bytes(b"\0" * 24)
    assert check_against_binarized(scan, str(prefix), str(bpe)) is False


def test_int_lines_at_the_int32_boundary():
    """Values from 2**31 on do not fit int32: written with int64 digits, not wrapped negative."""
    for value in (2 ** 31 - 1, 2 ** 31, 2 ** 31 + 5):
        assert int_lines(np.array([3, value]), [2]) == f"3 {value}\n"


def test_merge_checks_shards_line_by_line(english, capsys):
    d, args = english
    text_dir = d / "badshards"
    for i in (1, 2):
        assert cli.main(args + ["--destdir", str(d / "unused"), "--text-dir", str(text_dir), "--shard", f"{i}/2"]) == 0
    merge = args + ["--destdir", str(d / "badmerged"), "--text-dir", str(text_dir), "--merge-shards", "2"]
    shard2 = text_dir / "train.en.shard2of2.heads"
    good = shard2.read_text()
    lines = good.splitlines()
    lines[4] += " 0"
    shard2.write_text("\n".join(lines) + "\n")
    assert cli.main(merge) == 2
    err = capsys.readouterr().err
    assert f"shard2of2.labels:5: 10 labels but 11 heads in {shard2}:5" in err
    labels2 = text_dir / "train.en.shard2of2.labels"
    good_labels = labels2.read_text()
    label_lines = good_labels.splitlines()
    label_lines[4] += " punct"
    labels2.write_text("\n".join(label_lines) + "\n")
    assert cli.main(merge) == 2
    err = capsys.readouterr().err
    n1 = len((text_dir / "train.en.shard1of2.heads").read_text().splitlines())
    assert f"train.en:{n1 + 5}:" in err and str(shard2) in err and "expected equal counts" in err
    # a head past the words of its line: the error names the shard's line and the BPE line it parses
    labels2.write_text(good_labels)
    bad_heads = good.splitlines()
    fifth = bad_heads[4].split()
    bad_heads[4] = " ".join(["99"] + fifth[1:])
    shard2.write_text("\n".join(bad_heads) + "\n")
    assert cli.main(merge) == 2
    err = capsys.readouterr().err
    assert f"{shard2}:5: head 99 out of range; expected 0 (root) to {len(fifth)} (the words of BPE line {n1 + 5} " \
           "of" in err, err
    shard2.write_text("\n".join(good.splitlines()[:-1]) + "\n")
    labels2.write_text("\n".join(good_labels.splitlines()[:-1]) + "\n")
    assert cli.main(merge) == 2
    assert ".en:60: the 2 shards hold 59 lines but the BPE text has 60" in capsys.readouterr().err
    # one line too many: named at the shard's first line past the text
    shard2.write_text(good + good.splitlines()[-1] + "\n")
    labels2.write_text(good_labels + good_labels.splitlines()[-1] + "\n")
    assert cli.main(merge) == 2
    assert f"{shard2}:{60 - n1 + 1}: shards 1-2 have more lines than the 60 lines of" in capsys.readouterr().err
    os.remove(shard2)
    assert cli.main(merge) == 2
    assert f"{shard2}: shard 2 of 2 missing" in capsys.readouterr().err
    assert not os.path.exists(d / "badmerged" / "train.en.heads")


# ---- bad inputs ------------------------------------------------------------------------------------

def conllu_rows(words, heads=None):
    """One CoNLL-U sentence's token rows (without its blank line): ``heads`` 1-based, every word a root if None."""
    heads = heads or [0] * len(words)
    return "".join(f"{k + 1}\t{w}\t_\t_\t_\t_\t{h}\troot\t_\t_\n" for k, (w, h) in enumerate(zip(words, heads)))


def test_conllu_token_count_mismatch_names_both_files_and_line(tmp_path, capsys):
    (tmp_path / "train.en").write_text("the dog@@ s bark\na cat\n")
    (tmp_path / "train.en.conllu").write_text(conllu_rows(["the", "dogs", "bark"]) + "\n"
                                              + conllu_rows(["a", "cat", "x"]) + "\n")
    rc = cli.main(["-s", "en", "-t", "de", "--trainpref", str(tmp_path / "train"), "--destdir", str(tmp_path / "b"),
                   "--no-check-binarized", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{tmp_path / 'train.en'}:2: 2 words in the BPE text but 3 tokens in {tmp_path / 'train.en.conllu'}" in err


def test_failed_run_keeps_previous_databin(tmp_path, capsys):
    (tmp_path / "train.en").write_text("a b\nc d@@ e\n")
    (tmp_path / "valid.en").write_text("a b\n")
    common = ["-s", "en", "-t", "de", "--trainpref", str(tmp_path / "train"), "--validpref", str(tmp_path / "valid"),
              "--destdir", str(tmp_path / "bin"), "--parser", "none", "--no-check-binarized", "--no-progress"]
    assert cli.main(common) == 0
    before = _files(tmp_path / "bin")
    (tmp_path / "train.en").write_text("x y z\nw\n")
    (tmp_path / "valid.en").write_text("a\n\nb\n")  # the later split fails after train was staged
    assert cli.main(common) == 2
    assert f"{tmp_path / 'valid.en'}:2: empty line" in capsys.readouterr().err
    assert _files(tmp_path / "bin") == before
    assert not [n for n in os.listdir(tmp_path / "bin") if ".tmp-" in n]


def _binarized_source(prefix, token_counts):
    """A fairseq mmap source dataset as fairseq-preprocess writes it (tokens + </s> per line)."""
    import torch
    from fairseq.data.indexed_dataset import MMapIndexedDatasetBuilder

    builder = MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    for n in token_counts:
        builder.add_item(torch.arange(4, 4 + n + 1, dtype=torch.int32))
    builder.finalize(f"{prefix}.idx")


def test_binarized_mismatch_and_missing_inputs(tmp_path, capsys):
    (tmp_path / "valid.en").write_text("a b@@ c\nd e\nf\n")
    os.makedirs(tmp_path / "bin")
    _binarized_source(tmp_path / "bin" / "valid.en-de.en", [3, 2, 1])
    common = ["-s", "en", "-t", "de", "--destdir", str(tmp_path / "bin"), "--no-progress"]
    assert cli.main(common + ["--validpref", str(tmp_path / "valid"), "--parser", "none"]) == 0
    assert (tmp_path / "bin" / "valid.en.wordids").read_text() == "1 2 2\n1 2\n1\n"
    (tmp_path / "valid.en").write_text("a b@@ c\nd e x\nf\n")
    assert cli.main(common + ["--validpref", str(tmp_path / "valid"), "--parser", "none"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'valid.en'}:2: 3 tokens in the BPE text but 2 in the binarized source" in err
    (tmp_path / "valid.en").write_text("a b@@ c\nd e\n")
    assert cli.main(common + ["--validpref", str(tmp_path / "valid"), "--parser", "none"]) == 2
    assert "2 lines, but the binarized source" in capsys.readouterr().err
    assert cli.main(common + ["--validpref", str(tmp_path / "nope"), "--parser", "none"]) == 2
    assert f"{tmp_path / 'nope.en'}: no such file" in capsys.readouterr().err
    assert cli.main(common + ["--validpref", str(tmp_path / "valid"), "--parser", "conllu"]) == 2
    assert f"{tmp_path / 'valid.en.conllu'}: no such CoNLL-U file" in capsys.readouterr().err
    assert cli.main(common + ["--validpref", str(tmp_path / "valid"), "--parser", "none", "--destdir",
                              str(tmp_path / "empty")]) == 2
    assert "binarized source not found" in capsys.readouterr().err


def test_the_record_of_the_parser_names_what_each_parser_loads(tmp_path):
    """DESTDIR/source-parse.json (folded into preprocessing.json; from_pretrained parses raw input with it): the
    parser and the model it loads, defaults resolved as the backends resolve them; --record-only parses nothing."""
    from umst_plugin.preprocess import cli

    def record(*argv):
        args = cli.get_parser().parse_args(["-s", "en", "-t", "de", "--trainpref", "x", *argv])
        return cli.source_parse_record(args)

    assert record("--parser", "spacy") == {"parser": "spacy", "model": "en_core_web_md", "written_by": "umst-preprocess"}
    assert record("--parser", "spacy", "--parser-model", "en_core_web_sm")["model"] == "en_core_web_sm"
    assert record("--parser", "stanza")["model"] == "en"  # the source language
    assert record("--parser", "stanza", "--stanza-lang", "de", "--stanza-package", "gsd") == {
        "parser": "stanza", "model": "de", "stanza_package": "gsd", "written_by": "umst-preprocess"}
    assert record("--parser", "none") == {"parser": "none", "model": None, "written_by": "umst-preprocess"}
    assert record("--parser", "conllu", "--conllu-suffix", ".ud") == {
        "parser": "conllu", "model": None, "conllu_suffix": ".ud", "written_by": "umst-preprocess"}
    bpe = tmp_path / "train.en"
    bpe.write_text("a b@@ c\n")
    assert cli.main(["-s", "en", "-t", "de", "--trainpref", str(tmp_path / "train"), "--destdir", str(tmp_path / "db"),
                     "--parser", "spacy", "--record-only"]) == 0
    import json

    assert json.loads((tmp_path / "db" / "source-parse.json").read_text())["model"] == "en_core_web_md"
    assert sorted(os.listdir(tmp_path / "db")) == ["source-parse.json"]  # nothing parsed, nothing else written


def test_conllu_words_are_checked_unless_no_check_forms(tmp_path, capsys):
    """umst-preprocess --parser conllu compares the CoNLL-U's words with the BPE text's (Moses escapes undone);
    --no-check-forms keeps only the counts. The languages are required arguments, as fairseq-preprocess's are."""
    (tmp_path / "train.en").write_text("the dog@@ s bark\n")
    (tmp_path / "train.en.conllu").write_text(conllu_rows(["the", "cats", "bark"], heads=[3, 3, 0]) + "\n")
    args = ["-s", "en", "-t", "de", "--trainpref", str(tmp_path / "train"), "--parser", "conllu",
            "--no-check-binarized", "--no-progress"]
    assert cli.main(args + ["--destdir", str(tmp_path / "checked")]) == 2
    assert f"{tmp_path / 'train.en'}:1: word 2 is 'dogs' in the BPE text but 'cats' in" in capsys.readouterr().err
    assert cli.main(args + ["--destdir", str(tmp_path / "unchecked"), "--no-check-forms"]) == 0
    assert (tmp_path / "unchecked" / "train.en.heads").read_text() == "3 3 0\n"
    # an unsharded run records its parser; --record-only rewrites that record in the existing data-bin
    record = tmp_path / "unchecked" / "source-parse.json"
    assert '"conllu_suffix": ".conllu"' in record.read_text()
    assert cli.main(args + ["--destdir", str(tmp_path / "unchecked"), "--record-only", "--conllu-suffix", ".ud"]) == 0
    assert '"conllu_suffix": ".ud"' in record.read_text()
    with pytest.raises(SystemExit):
        cli.get_parser().parse_args(["-t", "de", "--trainpref", "x"])
    assert "the following arguments are required: -s/--source-lang" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.get_parser().parse_args(["-s", "en", "--trainpref", "x"])
    assert "the following arguments are required: -t/--target-lang" in capsys.readouterr().err
