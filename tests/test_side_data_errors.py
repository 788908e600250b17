"""Bad input gives an error naming the file, the line and what was expected, and leaves a
previously written data-bin exactly as it was."""
import hashlib
import os
import re
import shutil

import pytest

import e2e
from umst_dev import dev
from umst_plugin.preprocess.errors import SideDataError


def snapshot(directory):
    return {name: hashlib.sha256(open(os.path.join(directory, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(directory))}


@pytest.fixture
def workspace(toy_raw, toy_databin, tmp_path):
    """A private copy of the raw corpus and the finished data-bin."""
    raw, databin = tmp_path / "raw", tmp_path / "bin"
    shutil.copytree(toy_raw, raw)
    shutil.copytree(toy_databin, databin)
    return str(raw), str(databin)


def copy_side_file(databin, kind, from_split, to_split):
    """A side file of the data-bin (``wordids`` or ``heads``, .bin and .idx) copied over another split's."""
    for ext in ("bin", "idx"):
        shutil.copy(os.path.join(databin, f"{from_split}.kel-mor.kel.{kind}.{ext}"),
                    os.path.join(databin, f"{to_split}.kel-mor.kel.{kind}.{ext}"))


def rewrite_line(path, line_no, new_text=None, raw_bytes=None):
    with open(path, "rb") as f:
        lines = f.readlines()
    lines[line_no - 1] = raw_bytes if raw_bytes is not None else (new_text + "\n").encode("utf-8")
    with open(path, "wb") as f:
        f.writelines(lines)


def run_preprocess(raw, databin):
    return e2e.umst_preprocess("--source-lang", e2e.SRC, "--target-lang", e2e.TGT,
                               "--trainpref", os.path.join(raw, "train"), "--validpref", os.path.join(raw, "valid"),
                               "--testpref", os.path.join(raw, "test"), "--destdir", databin, check=False)


def assert_clean_failure(raw, databin, *fragments):
    before = snapshot(databin)
    proc = run_preprocess(raw, databin)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr
    assert snapshot(databin) == before, "a failed run changed the data-bin"


def test_line_count_mismatch(workspace):
    raw, databin = workspace
    with open(os.path.join(raw, "test.kel"), "a", encoding="utf-8") as f:
        f.write("se iso talo\n")
    assert_clean_failure(raw, databin, "test.kel:38:", "test.kel.conllu ended before this line")


def test_a_parse_file_longer_than_the_text_names_the_line_after_the_last(workspace):
    raw, databin = workspace
    path = os.path.join(raw, "test.kel")
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines[:-1])  # the CoNLL-U keeps its last sentence
    n_lines = len(lines)
    assert_clean_failure(raw, databin, f"test.kel:{n_lines}:",
                         f"test.kel.conllu has more sentences than the {n_lines - 1} lines of the BPE text")


def test_words_vs_parse_mismatch(workspace):
    raw, databin = workspace
    path = os.path.join(raw, "valid.kel")
    with open(path, encoding="utf-8") as f:
        third = f.readlines()[2].split()
    rewrite_line(path, 3, " ".join(third + ["iso"]))
    assert_clean_failure(raw, databin, "valid.kel:3:", "words in the BPE text but", "valid.kel.conllu")


def test_subword_count_mismatch_against_binarized_source(workspace):
    raw, databin = workspace
    path = os.path.join(raw, "train.kel")
    with open(path, encoding="utf-8") as f:
        line = f.readlines()[4].split()
    # same words, one more piece: the parse still fits, the binarized source does not
    whole = next(i for i, p in enumerate(line) if not p.endswith("@@") and len(p) > 2)
    line[whole:whole + 1] = [line[whole][:1] + "@@", line[whole][1:]]
    rewrite_line(path, 5, " ".join(line))
    assert_clean_failure(raw, databin, "train.kel:5:", "in the binarized source")


def test_malformed_conllu(workspace):
    raw, databin = workspace
    path = os.path.join(raw, "valid.kel.conllu")
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    bad_line = next(i for i, l in enumerate(lines) if l.startswith("2\t"))
    lines[bad_line] = "2\tonly-three\tcolumns\n"
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)
    assert_clean_failure(raw, databin, "valid.kel.conllu:", "malformed CoNLL-U")


def test_empty_line(workspace):
    raw, databin = workspace
    rewrite_line(os.path.join(raw, "test.kel"), 7, "")
    assert_clean_failure(raw, databin, "test.kel:7:", "empty line")


def test_non_utf8_byte(workspace):
    raw, databin = workspace
    rewrite_line(os.path.join(raw, "valid.kel"), 12, raw_bytes=b"se iso \xff\xfe talo\n")
    assert_clean_failure(raw, databin, "valid.kel:12:", "not valid UTF-8")


def test_task_refuses_misaligned_side_data(workspace):
    """Side files of another split copied over: the task stops at load time, naming file and line."""
    _, databin = workspace
    for kind in ("wordids", "heads"):
        copy_side_file(databin, kind, "test", "valid")
    task = dev.setup_task(databin, {"source_lang": e2e.SRC, "target_lang": e2e.TGT})
    with pytest.raises(SideDataError, match=r"valid\.kel-mor\.kel\.wordids\.bin:1: .* word ids but"):
        task.load_dataset("valid")


def test_task_refuses_a_head_file_of_another_length(workspace):
    """Only the heads copied from another split (the word ids right): the line counts are compared each on its own,
    and the error says both counts and the source's."""
    _, databin = workspace
    copy_side_file(databin, "heads", "train", "valid")
    task = dev.setup_task(databin, {"source_lang": e2e.SRC, "target_lang": e2e.TGT})
    with pytest.raises(SideDataError, match=r"valid\.kel-mor\.kel\.wordids\.bin: (\d+) word-id and (?!\1 )\d+ head "
                                            r"lines but \1 source sentences"):
        task.load_dataset("valid")


def test_task_names_the_first_sentence_whose_heads_do_not_fit_its_words(workspace):
    """Heads of another split with as many sentences: the error names the first sentence (1-based line) whose head
    count differs from its number of words."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    _, databin = workspace
    copy_side_file(databin, "heads", "test", "valid")
    word_ids = MMapIndexedDataset(os.path.join(databin, "valid.kel-mor.kel.wordids"))
    heads = MMapIndexedDataset(os.path.join(databin, "valid.kel-mor.kel.heads"))
    assert len(word_ids) == len(heads)
    first = next(i for i in range(len(heads)) if len(heads[i]) != int(word_ids[i][-1]))
    task = dev.setup_task(databin, {"source_lang": e2e.SRC, "target_lang": e2e.TGT})
    with pytest.raises(SideDataError) as error:
        task.load_dataset("valid")
    assert re.search(rf"valid\.kel-mor\.kel\.heads\.bin:{first + 1}: {len(heads[first])} heads but "
                     rf"{int(word_ids[first][-1])} words in the word ids", str(error.value)), (first, str(error.value))


def test_task_names_missing_side_data(workspace):
    _, databin = workspace
    os.remove(os.path.join(databin, "valid.kel-mor.kel.heads.bin"))
    task = dev.setup_task(databin, {"source_lang": e2e.SRC, "target_lang": e2e.TGT})
    with pytest.raises(SideDataError, match="side data not found; run umst-preprocess"):
        task.load_dataset("valid")
