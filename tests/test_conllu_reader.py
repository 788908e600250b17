"""The CoNLL-U reader (``--parser conllu``): multi-word tokens collapse onto their surface token, and bad
input stops with an error naming the file, the sentence's first line and what was expected."""
import pytest

from umst_plugin.preprocess.conllu_reader import read_conllu
from umst_plugin.preprocess.errors import SideDataError


def row(wid, form, head, deprel="dep"):
    return "\t".join([str(wid), form, form, "X", "_", "_", str(head), deprel, "_", "_"]) + "\n"


GOOD = "# text = a dog\n" + row(1, "a", 2, "det") + row(2, "dog", 0, "root") + "\n"
# "zum Haus gehen": zum = zu dem, both attached to Haus; the surface token takes Haus as its head
MWT = ("# text = zum Haus gehen\n" + "1-2\tzum\t_\t_\t_\t_\t_\t_\t_\t_\n" + row(1, "zu", 3, "case")
       + row(2, "dem", 3, "det") + row(3, "Haus", 4, "obl") + row(4, "gehen", 0, "root") + "\n")


def parse(tmp_path, text, name="train.en.conllu"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path, list(read_conllu(str(path)))


def test_multiword_tokens_collapse_onto_the_surface_token(tmp_path):
    _, (good, mwt) = parse(tmp_path, GOOD + MWT)
    assert (good.forms, good.heads, good.labels) == (["a", "dog"], [2, 0], ["det", "root"])
    assert (mwt.forms, mwt.heads, mwt.labels) == (["zum", "Haus", "gehen"], [2, 3, 0], ["case", "obl", "root"])


def test_windows_line_ends_read_as_unix_ones(tmp_path):
    _, unix = parse(tmp_path, GOOD + MWT)
    _, windows = parse(tmp_path, (GOOD + MWT).replace("\n", "\r\n"), "windows.conllu")
    assert [(p.forms, p.heads, p.labels) for p in windows] == [(p.forms, p.heads, p.labels) for p in unix]



def test_lone_carriage_returns_stop_naming_the_line(tmp_path):
    # classic-Mac line ends: the reader would see one line; it says why instead of "no word lines"
    with pytest.raises(SideDataError, match=r"mac\.conllu:1: carriage return .* expected \\n or \\r\\n"):
        parse(tmp_path, (GOOD + MWT).replace("\n", "\r"), "mac.conllu")
    # a stray one in the second sentence (line 5), after a good first sentence
    with pytest.raises(SideDataError, match=r"stray\.conllu:5: carriage return"):
        parse(tmp_path, GOOD + MWT.replace("\n", "\r", 1), "stray.conllu")


@pytest.mark.parametrize("block, line, expected", [
    # the second sentence starts at line 5 (after GOOD's three lines and its blank line)
    ("# c\n1\ta\ta\tX\t_\t_\t0\troot\t_\n", 6, "malformed CoNLL-U line with 9 columns; expected 10 tab-separated columns"),
    (row(1, "a", 0, "root") + row(3, "b", 1), 5, "word ids not consecutive (found 3, expected 2)"),
    (row(1, "a", 0, "root") + row(2, "b", 7), 5, "word 2 points to head 7, but the sentence has 2 words"),
    (row(1, "a", 0, "root") + row(2, "b", "_"), 5, "word 2 has head None; expected an integer"),
    ("# only a comment\n", 5, "no word lines; expected at least one"),
    # after a multi-word token the error still names the sentence's first line (not the token's ids)
    (MWT.replace(row(4, "gehen", 0, "root"), row(4, "gehen", 9, "root")), 5,
     "word 4 points to head 9, but the sentence has 4 words"),
    (MWT.replace(row(3, "Haus", 4, "obl"), row(5, "Haus", 4, "obl")), 5, "word ids not consecutive (found 5, expected 3)"),
])
def test_bad_sentences_name_the_file_the_line_and_what_was_expected(tmp_path, block, line, expected):
    path = tmp_path / "train.en.conllu"
    path.write_text(GOOD + block + "\n")
    with pytest.raises(SideDataError) as e:
        list(read_conllu(str(path)))
    assert str(e.value).startswith(f"{path}:{line}: {expected}"), str(e.value)


def test_bytes_that_are_not_utf8_name_their_line(tmp_path):
    path = tmp_path / "train.en.conllu"
    path.write_bytes(GOOD.encode() + row(1, "caf\xe9", 0, "root").encode("latin-1"))
    with pytest.raises(SideDataError, match=r"train\.en\.conllu:5: not valid UTF-8 .*expected UTF-8 CoNLL-U"):
        list(read_conllu(str(path)))
