"""umst_plugin/text_preprocessing.py on its own: the record's checks, its writing, what it says it does, the
text steps' switches, and how explicit --tokenizer / --bpe arguments are compared with it (docs/inference.md).

tests/test_inference.py runs the same code end to end (a recipe's data-bin, trained models, fairseq-interactive);
these tests pin each branch one at a time, in a second or two, on a data-bin of one codes file.
"""
import json
import os
from argparse import Namespace

import pytest

from umst_plugin import text_preprocessing as textprep

CODES = "#version: 0.2\nt h\nth e</w>\n"


@pytest.fixture
def databin(tmp_path):
    db = tmp_path / "data-bin"
    db.mkdir()
    (db / "bpe.codes").write_text(CODES, encoding="utf-8")
    return db


def good_record(**changes):
    record = {"format": textprep.FORMAT, "version": textprep.VERSION, "written_by": "test", "languages": ["en", "ro"],
              "order": list(textprep.ORDER),
              "normalisation": {"moses_punctuation": True, "remove_non_printing": True, "romanian": ["ro"]},
              "lowercase": False,
              "tokenizer": {"name": "moses", "aggressive_dash_splits": True, "escape": True},
              "bpe": {"name": "subword_nmt", "codes": "bpe.codes", "merges": 2, "separator": "@@"}}
    record.update(changes)
    return record


def with_field(group, key, value):
    record = good_record()
    record[group] = {**record[group], key: value}
    return record


def load(databin, data):
    (databin / textprep.RECORD_NAME).write_text(json.dumps(data), encoding="utf-8")
    return textprep.read_record(str(databin))


# ---- the record's checks ------------------------------------------------------------------------------

BROKEN = [
    ("not an object", [], r'not a text-preprocessing record \(expected a JSON object with "format"'),
    ("no format", {k: v for k, v in good_record().items() if k != "format"}, r"not a text-preprocessing record"),
    ("version", good_record(version=2), r"version 2; this plugin reads version 1"),
    ("order", good_record(order=list(reversed(textprep.ORDER))), r"steps in the order \['bpe', .*only \['moses_"),
    ("languages type", good_record(languages="en"), r'"languages" is \'en\'; expected a list'),
    ("normalisation type", good_record(normalisation=None), r'"normalisation" is None; expected a dict'),
    ("lowercase type", good_record(lowercase="yes"), r'"lowercase" is \'yes\'; expected a bool'),
    ("tokenizer type", good_record(tokenizer="moses"), r'"tokenizer" is \'moses\'; expected a dict'),
    ("bpe type", good_record(bpe=[]), r'"bpe" is \[\]; expected a dict'),
    ("no languages", good_record(languages=[]), r'"languages" is \[\]; expected language codes such as'),
    ("a language not a code", good_record(languages=["en", 7]), r'"languages" is \[\'en\', 7\]; expected language'),
    ("punctuation", with_field("normalisation", "moses_punctuation", 1),
     r'"normalisation.moses_punctuation" is 1; expected a bool'),
    ("non-printing", with_field("normalisation", "remove_non_printing", None),
     r'"normalisation.remove_non_printing" is None; expected a bool'),
    ("romanian", with_field("normalisation", "romanian", "ro"), r'"normalisation.romanian" is \'ro\'; expected a list'),
    ("tokenizer name type", with_field("tokenizer", "name", None), r'"tokenizer.name" is None; expected a str'),
    ("dash splits", with_field("tokenizer", "aggressive_dash_splits", "no"),
     r'"tokenizer.aggressive_dash_splits" is \'no\'; expected a bool'),
    ("escape", with_field("tokenizer", "escape", 0), r'"tokenizer.escape" is 0; expected a bool'),
    ("bpe name type", with_field("bpe", "name", 3), r'"bpe.name" is 3; expected a str'),
    ("tokenizer name", with_field("tokenizer", "name", "nltk"), r'"tokenizer.name" is \'nltk\'; expected one of moses, '
                                                                r'none'),
    ("bpe name", with_field("bpe", "name", "sentencepiece"),
     r'"bpe.name" is \'sentencepiece\'; expected one of subword_nmt, none'),
    ("no codes", good_record(bpe={"name": "subword_nmt"}), r'"bpe.codes" is missing; expected the codes file'),
    ("parse not an object", good_record(source_parse="spacy"), r'"source_parse" is \'spacy\'; expected \{"parser"'),
    ("parse without parser", good_record(source_parse={"model": "x"}), r'"source_parse" is .*expected'),
    ("parse model a number", good_record(source_parse={"parser": "spacy", "model": 3}), r'"source_parse" is .*expected'),
    ("romanian not a language", with_field("normalisation", "romanian", ["ro", "fr"]),
     r'"normalisation.romanian" is \[\'ro\', \'fr\'\]; expected a subset of "languages" \[\'en\', \'ro\'\]'),
]


@pytest.mark.parametrize("what,data,pattern", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_record_names_the_file_and_what_was_expected(databin, what, data, pattern):
    path = databin / textprep.RECORD_NAME
    with pytest.raises(textprep.RecordError, match=pattern) as info:
        load(databin, data)
    assert str(info.value).startswith(f"{path}: ") and info.value.path == str(path)


def test_a_record_reads_what_it_says(databin):
    record = load(databin, good_record(source_parse={"parser": "stanza", "model": None, "stanza_package": "gsd"}))
    assert (record.languages, record.romanian, record.lowercase) == (["en", "ro"], ["ro"], False)
    assert (record.moses_punctuation, record.remove_non_printing) == (True, True)
    assert (record.tokenizer, record.aggressive_dash_splits, record.escape) == ("moses", True, True)
    assert record.bpe_codes == os.path.join(str(databin), "bpe.codes") and record.bpe_merges == 2
    assert (record.source_parser, record.source_parser_model, record.source_parser_package) == ("stanza", None, "gsd")
    # optional parts: no order written, no parse, no codes without BPE, the default separator
    data = good_record(bpe={"name": "none"})
    del data["order"]
    record = load(databin, data)
    assert record.bpe_codes is None and record.bpe_separator == "@@" and record.source_parser is None
    assert textprep.read_record(str(databin / "nowhere")) is None
    # every language Romanian-normalised (a record of Romanian alone)
    record = load(databin, good_record(languages=["ro"]))
    assert record.romanian == record.languages == ["ro"]


# ---- writing it ---------------------------------------------------------------------------------------

def test_write_record_round_trips_and_folds_in_the_parse(databin):
    (databin / textprep.SOURCE_PARSE_NAME).write_text('{"parser": "spacy", "model": "en_core_web_md"}',
                                                        encoding="utf-8")
    path = textprep.write_record(str(databin), ("en", "ro"), lowercase=True, aggressive_dash_splits=False,
                                 escape=False, romanian=["ro"], moses_punctuation=False, remove_non_printing=False,
                                 bpe_codes=str(databin / "bpe.codes"), merges=2, separator="##", written_by="me")
    assert path == str(databin / textprep.RECORD_NAME) and not os.path.exists(path + ".tmp")
    data = json.loads((databin / textprep.RECORD_NAME).read_text(encoding="utf-8"))
    assert data["bpe"]["codes"] == "bpe.codes"  # relative to the data-bin, though given absolute
    assert data["written_by"] == "me" and data["order"] == textprep.ORDER
    record = textprep.read_record(str(databin))
    assert (record.lowercase, record.aggressive_dash_splits, record.escape) == (True, False, False)
    assert (record.moses_punctuation, record.remove_non_printing, record.romanian) == (False, False, ["ro"])
    assert (record.bpe_merges, record.bpe_separator, record.bpe_codes_sha256) == (
        2, "##", textprep.sha256_file(str(databin / "bpe.codes")))
    assert (record.source_parser, record.source_parser_model) == ("spacy", "en_core_web_md")
    # the defaults are the recipes' (tokenizer.perl -a, escaping, punctuation and non-printing normalisation)
    textprep.write_record(str(databin), ["en"], lowercase=False, bpe_codes="bpe.codes")
    record = textprep.read_record(str(databin))
    assert (record.aggressive_dash_splits, record.escape, record.moses_punctuation, record.remove_non_printing,
            record.romanian, record.tokenizer, record.bpe) == (True, True, True, True, [], "moses", "subword_nmt")
    # without BPE: no codes needed, none recorded
    textprep.write_record(str(databin), ["en"], lowercase=False, bpe="none", tokenizer="none")
    record = textprep.read_record(str(databin))
    assert (record.bpe, record.bpe_codes, record.tokenizer) == ("none", None, "none")


def test_write_record_refuses_what_it_cannot_record(databin):
    expect = [
        (dict(databin=str(databin / "missing")), r"the data-bin directory does not exist"),
        (dict(romanian=["ro"]), r"Romanian normalisation for \['ro'\], which are not among the languages \['en'\]"),
        (dict(bpe_codes=None), r"subword_nmt BPE needs its codes file"),
        (dict(bpe_codes="other.codes"), r"BPE codes .*other\.codes do not exist"),
    ]
    for changes, pattern in expect:
        args = {**dict(databin=str(databin), languages=["en"], lowercase=False, bpe_codes="bpe.codes"), **changes}
        with pytest.raises(textprep.RecordError, match=pattern):
            textprep.write_record(args.pop("databin"), args.pop("languages"), **args)
    (databin / textprep.SOURCE_PARSE_NAME).write_text("{parser", encoding="utf-8")
    with pytest.raises(textprep.RecordError, match=r"source-parse\.json is not valid JSON .*run umst-preprocess again"):
        textprep.write_record(str(databin), ["en"], lowercase=False, bpe_codes="bpe.codes")
    assert not (databin / textprep.RECORD_NAME).exists()


# ---- what it says it does -------------------------------------------------------------------------------

def test_describe_names_every_step_a_side_gets(databin):
    record = load(databin, good_record())
    assert record.describe("ro") == (
        "Moses punctuation normalisation, non-printing characters to spaces, Romanian normalisation and diacritics "
        "removal, Moses tokenizer (ro, aggressive dash splits, escaping), subword-nmt BPE (bpe.codes, 2 merges)")
    assert "Romanian" not in record.describe("en")
    record = load(databin, good_record(lowercase=True, tokenizer={"name": "moses", "aggressive_dash_splits": False,
                                                                  "escape": False},
                                       bpe={"name": "subword_nmt", "codes": "bpe.codes"}))
    assert record.describe("en").endswith(
        "lowercasing, Moses tokenizer (en, no aggressive dash splits, no escaping), subword-nmt BPE (bpe.codes)")
    data = good_record(tokenizer={"name": "none", "aggressive_dash_splits": True, "escape": True}, bpe={"name": "none"},
                       normalisation={"moses_punctuation": False, "remove_non_printing": False, "romanian": []})
    assert load(databin, data).describe("en") == "nothing (whitespace only)"


# ---- the text steps ---------------------------------------------------------------------------------------

def test_romanian_normalisation_maps_every_character():
    assert textprep.normalise_romanian("\u015e\u015f\u0162\u0163") == "\u0218\u0219\u021a\u021b"
    assert textprep.remove_romanian_diacritics("\u0218\u0219\u021a\u021b\u0102\u0103\u00c2\u00e2\u00ce\u00ee") == \
        "SsTtAaAaIi"
    assert textprep.remove_non_printing("a\tb\x07c\u200bd é") == "a b c d é"


def test_line_preparer_switches_each_step():
    line = "\u015etefan  \u201eWell-known\u201d  <b>\x07\n"
    everything = textprep.LinePreparer("ro", romanian=True, lowercase=True)
    assert everything(line) == "stefan &quot; well @-@ known &quot; &lt; b &gt;"
    assert textprep.LinePreparer("ro")(line) == "\u015etefan &quot; Well @-@ known &quot; &lt; b &gt;"
    assert textprep.LinePreparer("en", aggressive_dash_splits=False, escape=False)(line) == \
        "\u015etefan \" Well-known \" < b >"
    # no punctuation normalisation: the typographic quotes stay (the tokenizer keeps them)
    assert textprep.LinePreparer("en", moses_punctuation=False)(line).split()[1] == "\u201e"
    # non-printing characters kept: the bell stays in the text
    assert "\x07" in textprep.LinePreparer("en", remove_non_printing=False, tokenizer="none")(line)
    # no tokenizer: whitespace only
    assert textprep.LinePreparer("en", tokenizer="none")(line) == "\u015etefan \"Well-known\" <b>"
    with pytest.raises(ValueError, match=r"tokenizer 'spacy': expected one of moses, none"):
        textprep.LinePreparer("en", tokenizer="spacy")


def test_recorded_tokenizer_detokenizes_only_what_moses_tokenized(databin):
    record = load(databin, good_record())
    tok = textprep.RecordedTokenizer(record, "en", "en")  # the English detokenizer joins "'s"
    # English punctuation normalisation moves the full stop inside the quotes, as the recipe's text got it
    assert tok.encode("It's \u201cgood\u201d.") == "It &apos;s &quot; good . &quot;"
    assert tok.decode("It &apos;s &quot; good &quot; .") == "It's \"good\"."
    plain = load(databin, good_record(tokenizer={"name": "none", "aggressive_dash_splits": True, "escape": True}))
    assert textprep.RecordedTokenizer(plain, "en", "ro").decode("It &apos;s .") == "It &apos;s ."
    with pytest.raises(textprep.RecordError, match=r"records languages \['en', 'ro'\], not 'de'"):
        textprep.RecordedTokenizer(record, "en", "de")


# ---- explicit arguments against the record ----------------------------------------------------------------

def test_registry_choice_reads_each_form_fairseq_passes():
    from omegaconf import OmegaConf

    assert textprep.registry_choice(None, "bpe") is None
    assert textprep.registry_choice("moses", "tokenizer") == "moses"
    assert textprep.registry_choice(OmegaConf.create({"_name": "subword_nmt", "bpe": "gpt2"}), "bpe") == "subword_nmt"
    # a config with _name unset chose nothing (it does not fall back to a field of the kind's name)
    assert textprep.registry_choice(Namespace(_name=None, bpe="gpt2"), "bpe") is None
    assert textprep.registry_choice(Namespace(tokenizer="space"), "tokenizer") == "space"
    assert textprep.registry_choice(Namespace(), "tokenizer") is None


def test_conflicts_name_each_contradicting_argument(databin):
    record = load(databin, good_record())
    assert textprep.tokenizer_conflicts(record, None) == []
    assert textprep.tokenizer_conflicts(record, Namespace(tokenizer="moses")) == []
    assert textprep.tokenizer_conflicts(record, "space") == ["tokenizer: recorded 'moses', given 'space'"]
    assert textprep.bpe_conflicts(record, None) == []
    assert textprep.bpe_conflicts(record, "gpt2") == ["bpe: recorded 'subword_nmt', given 'gpt2'"]
    same = databin / "same.codes"  # another path, the same codes: agrees
    same.write_text(CODES, encoding="utf-8")
    assert textprep.bpe_conflicts(record, Namespace(bpe="subword_nmt", bpe_codes=str(same))) == []
    assert textprep.bpe_conflicts(record, Namespace(bpe="subword_nmt", bpe_codes=str(same), bpe_separator="@@")) == []
    assert textprep.bpe_conflicts(record, Namespace(bpe="subword_nmt", bpe_codes=str(databin / "gone"))) == [
        f"bpe_codes: {databin / 'gone'} does not exist (the record's codes are {record.bpe_codes})"]
    assert textprep.bpe_conflicts(record, Namespace(bpe="subword_nmt", bpe_separator="##")) == [
        "bpe_separator: recorded '@@', given '##'"]
    unsplit = load(databin, good_record(bpe={"name": "none"}))
    assert textprep.bpe_conflicts(unsplit, Namespace(bpe="none", bpe_separator="##")) == []


def test_build_follows_the_record_or_the_arguments(databin):
    record = load(databin, good_record())
    with pytest.raises(ValueError, match=r"text_preprocessing='recorded': expected one of record, arguments"):
        textprep.build_tokenizer(record, None, "en", "ro", mode="recorded")
    with pytest.raises(ValueError, match=r"expected one of record, arguments"):
        textprep.build_bpe(record, None, mode="recorded")
    assert isinstance(textprep.build_tokenizer(record, None, "en", "ro"), textprep.RecordedTokenizer)
    assert textprep.build_tokenizer(record, None, "en", "ro", mode="arguments") is None  # fairseq's: none asked
    assert textprep.build_bpe(record, None, mode="arguments") is None
    bpe = textprep.build_bpe(record, None)
    assert bpe.encode("the") == "the" and bpe.bpe.separator == "@@"
    with pytest.raises(textprep.PreprocessingMismatch, match=r"bpe: recorded 'subword_nmt', given 'gpt2'"):
        textprep.build_bpe(record, "gpt2")
    assert textprep.build_bpe(load(databin, good_record(bpe={"name": "none"})), None) is None
    message = textprep.missing_record_message("DB")
    assert message.startswith("DB has no preprocessing.json") and "python scripts/wmt_prep.py record" in message
