"""The CoNLL-U reader (``--parser conllu``): multi-word tokens collapse onto their surface token, and bad
input stops with an error naming the file, the sentence's first line and what was expected."""
import pytest

from umst_plugin.preprocess.conllu_reader import collapse_multiword, read_conllu
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


# Hebrew "garti babayit" (I lived in the house): babayit = be + ha + bayit, and the token's syntactic head is its
# last member (be and ha attach to bayit, inside the token; bayit to garti), as UD's Hebrew treebank writes it
HEAD_LAST_MWT = ("# text = גרתי בבית\n" + row(1, "גרתי", 0, "root")
                 + "2-4\tבבית\t_\t_\t_\t_\t_\t_\t_\t_\n" + row(2, "ב", 4, "case") + row(3, "ה", 4, "det")
                 + row(4, "בית", 1, "obl") + "\n")
# an enhanced-UD empty node (5.1, the elided verb of a gapping clause): no basic head, not a surface token
EMPTY_NODE = ("# text = I like tea and you coffee\n" + row(1, "I", 2, "nsubj") + row(2, "like", 0, "root")
              + row(3, "tea", 2, "obj") + row(4, "and", 5, "cc") + row(5, "you", 2, "conj")
              + "5.1\tlike\tlike\tVERB\t_\t_\t_\t_\t2:conj\t_\n" + row(6, "coffee", 5, "orphan") + "\n")


def test_a_multiword_token_takes_the_member_whose_head_is_outside_it(tmp_path):
    """The token's head and label are its syntactic head word's: the member attached outside the token, wherever it
    stands in it (here the last; the first in ``zum``), not a member attached inside it (which would point the
    token at itself)."""
    _, (mwt,) = parse(tmp_path, HEAD_LAST_MWT)
    assert (mwt.forms, mwt.heads, mwt.labels) == (["גרתי", "בבית"], [0, 1], ["root", "obl"])
    # stanza's parses collapse through the same rule (collapse_multiword: (word id, head, label) per member)
    assert collapse_multiword([[(1, 0, "root")], [(2, 4, "case"), (3, 4, "det"), (4, 1, "obl")]]) == (
        [0, 1], ["root", "obl"])
    assert collapse_multiword([[(1, 3, "case"), (2, 3, "det")], [(3, 4, "obl")], [(4, 0, "root")]]) == (
        [2, 3, 0], ["case", "obl", "root"])


def test_empty_nodes_are_left_out(tmp_path):
    _, (parse_,) = parse(tmp_path, EMPTY_NODE)
    assert parse_.forms == ["I", "like", "tea", "and", "you", "coffee"]
    assert (parse_.heads, parse_.labels) == ([2, 0, 2, 5, 2, 5], ["nsubj", "root", "obj", "cc", "conj", "orphan"])


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
