"""Parser backends: stanza (Document conversion, real Pipeline construction errors), spaCy on real English,
and the fallback graph for sentences a parser fails on."""
import os
import re
import sys
from argparse import Namespace

import pytest

import e2e
from umst_plugin.preprocess import cli, parsers
from umst_plugin.preprocess.conllu_reader import SurfaceParse
from umst_plugin.preprocess.errors import ParserSetupError
from umst_plugin.preprocess.stanza_backend import StanzaBackend, download_command, parses_from_document

try:
    from stanza.models.common.doc import Document
    from stanza.utils.conll import CoNLL
except ImportError:  # stanza is an optional extra; only its tests need it
    Document = CoNLL = None
needs_stanza = pytest.mark.skipif(CoNLL is None, reason="stanza not installed")

MWT_CONLLU = """# text = zum Haus gehen
1-2\tzum\t_\t_\t_\t_\t_\t_\t_\t_
1\tzu\tzu\tADP\t_\t_\t3\tcase\t_\t_
2\tdem\tder\tDET\t_\t_\t3\tdet\t_\t_
3\tHaus\tHaus\tNOUN\t_\t_\t4\tobl\t_\t_
4\tgehen\tgehen\tVERB\t_\t_\t0\troot\t_\t_

"""


@needs_stanza
def test_stanza_document_with_multiword_token():
    doc = CoNLL.conll2doc(input_str=MWT_CONLLU)
    [parse] = parses_from_document(doc, [["zum", "Haus", "gehen"]])
    # zum takes the head/label of its syntactic head word (dem -> Haus, zu -> Haus; first outside = zu)
    assert parse.heads == [2, 3, 0]
    assert parse.labels == ["case", "obl", "root"]


@needs_stanza
def test_stanza_document_from_token_dicts_and_misalignment():
    doc = Document([[{"id": 1, "text": "the", "head": 2, "deprel": "det"},
                     {"id": 2, "text": "dog", "head": 3, "deprel": "nsubj"},
                     {"id": 3, "text": "barks", "head": 0, "deprel": "root"}]])
    [parse] = parses_from_document(doc, [["the", "dog", "barks"]])
    assert (parse.heads, parse.labels) == ([2, 3, 0], ["det", "nsubj", "root"])
    with pytest.raises(ValueError, match="3 tokens for 2 words"):
        parses_from_document(doc, [["the", "dog"]])
    with pytest.raises(ValueError, match="1 sentences for 2 input lines"):
        parses_from_document(doc, [["a"], ["b"]])
    with pytest.raises(ValueError, match="stanza token 'dog' for word 'cat'"):
        parses_from_document(doc, [["the", "cat", "barks"]])
    no_heads = Document([[{"id": 1, "text": "hi"}]])
    with pytest.raises(ValueError, match="no heads"):
        parses_from_document(no_heads, [["hi"]])


@needs_stanza
def test_stanza_missing_model_names_the_download_command(tmp_path):
    with pytest.raises(ParserSetupError) as err:
        StanzaBackend(Namespace(parser_model="en", stanza_dir=str(tmp_path), device="cpu"))
    message = str(err.value)
    command = download_command("en", str(tmp_path), "tokenize,pos,lemma,depparse")
    assert command in message
    assert str(tmp_path) in message and "'en'" in message
    # the command is one valid python -c invocation, with this interpreter (not a bare `python`: another one)
    assert command.startswith(sys.executable + " -c "), command
    code = re.search(r' -c "(.*)"', command).group(1)
    compile(code, "<download>", "exec")


def test_stanza_language_and_device_follow_the_options():
    """The language: --stanza-lang, else --parser-model, else --source-lang, else English; the device: as given,
    or for ``auto`` (and none) the GPU where torch sees one."""
    import torch

    from umst_plugin.preprocess.stanza_backend import resolve_device

    def lang(**options):
        return StanzaBackend(Namespace(**options), pipeline=lambda sentences: None).lang

    assert lang() == "en" and lang(source_lang="de") == "de"
    assert lang(source_lang="de", parser_model="fr") == "fr"
    assert lang(source_lang="de", parser_model="fr", stanza_lang="ro") == "ro"
    assert resolve_device("cpu") == "cpu" and resolve_device("cuda:1") == "cuda:1"
    assert resolve_device("auto") == resolve_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")


@needs_stanza
def test_stanza_pipeline_takes_the_words_as_given_on_the_device_and_batch_asked(tmp_path, monkeypatch):
    """What the backend asks of stanza's real Pipeline (which then stops here: no model is downloaded): the words as
    given (pretokenized, one sentence per line), the device and whether it is a GPU, and --batch-tokens (5,000 where
    unset) as the POS, lemma and parser batch sizes."""
    import stanza

    asked = []
    real_init = stanza.Pipeline.__init__

    def recording_init(self, *args, **kwargs):
        asked.append(kwargs)
        return real_init(self, *args, **kwargs)

    monkeypatch.setattr(stanza.Pipeline, "__init__", recording_init)
    for options in (dict(device="cpu"), dict(device="cuda:0", batch_tokens=700)):
        with pytest.raises(ParserSetupError):
            StanzaBackend(Namespace(parser_model="en", stanza_dir=str(tmp_path), **options))
    assert [(kw["tokenize_pretokenized"], kw["device"], kw["use_gpu"]) for kw in asked] == [
        (True, "cpu", False), (True, "cuda:0", True)]
    for kw, batch in zip(asked, (5000, 700)):
        assert kw["pos_batch_size"] == kw["lemma_batch_size"] == kw["depparse_batch_size"] == batch


@needs_stanza
def test_stanza_missing_model_cli(tmp_path, toy_raw):
    proc = e2e.umst_preprocess("-s", e2e.SRC, "-t", e2e.TGT, "--validpref", os.path.join(toy_raw, "valid"),
                               "--destdir", tmp_path / "bin", "--parser", "stanza", "--parser-model", "en",
                               "--stanza-dir", tmp_path / "stanza", "--no-check-binarized", "--no-progress",
                               check=False)
    assert proc.returncode == 2
    assert "stanza.download('en'" in proc.stderr and str(tmp_path / "stanza") in proc.stderr
    assert not os.path.exists(tmp_path / "bin" / f"valid.{e2e.SRC}.heads")


class GoldStanzaPipeline:
    """Stands in for the stanza *model* only: returns the real stanza Document that stanza's own CoNLL-U
    reader builds from the gold parse of each requested sentence. Records what it was called with."""

    def __init__(self, conllu_path):
        text = open(conllu_path, encoding="utf-8").read()
        self.blocks = {}
        for block in text.strip().split("\n\n"):
            words = [line.split("\t")[1] for line in block.splitlines() if line and not line.startswith("#")]
            self.blocks[tuple(words)] = block
        self.calls = []

    def __call__(self, sentences):
        assert all(isinstance(s, list) and all(isinstance(w, str) for w in s) for s in sentences)  # pretokenized
        self.calls.append(len(sentences))
        return CoNLL.conll2doc(input_str="\n\n".join(self.blocks[tuple(s)] for s in sentences) + "\n\n")


@needs_stanza
def test_stanza_heads_and_labels_survive_into_side_files(tmp_path, toy_raw, monkeypatch):
    valid = os.path.join(toy_raw, "valid")
    gold = GoldStanzaPipeline(f"{valid}.{e2e.SRC}.conllu")
    monkeypatch.setattr(StanzaBackend, "build_pipeline", lambda self, args: gold)
    common = ["-s", e2e.SRC, "-t", e2e.TGT, "--validpref", valid, "--no-check-binarized", "--no-progress"]
    assert cli.main(common + ["--destdir", str(tmp_path / "stanza"), "--parser", "stanza", "--batch-size", "8",
                              "--chunk-size", "16"]) == 0
    assert gold.calls and max(gold.calls) <= 8
    assert cli.main(common + ["--destdir", str(tmp_path / "conllu"), "--parser", "conllu"]) == 0
    for kind in ("heads", "labels", "wordids"):
        a = (tmp_path / "stanza" / f"valid.{e2e.SRC}.{kind}").read_bytes()
        assert a == (tmp_path / "conllu" / f"valid.{e2e.SRC}.{kind}").read_bytes(), kind
    labels = (tmp_path / "stanza" / f"valid.{e2e.SRC}.labels").read_text().split()
    assert {"nsubj", "obj", "root"} <= set(labels)
    assert not os.path.exists(tmp_path / "stanza" / ".umst-work")


# ---- fallbacks ---------------------------------------------------------------------------------------

class Flaky(parsers.ParserBackend):
    """A parser that fails on sentences containing 'boom' and misaligns on 'short' (chain heads otherwise)."""

    name = "flaky"

    def parse(self, sentences):
        out = []
        for words in sentences:
            if "boom" in words:
                raise RuntimeError("parser crashed")
            n = len(words) - 1 if "short" in words else len(words)
            heads, labels = [0] + list(range(1, n)), ["x"] * n
            if "unlabelled" in words:  # the heads line up, the labels do not
                labels = labels[:-1]
            if "loop" in words:  # the last word its own head
                heads[-1] = n
            if "beyond" in words:  # the last word's head past the sentence's end
                heads[-1] = n + 1
            out.append(SurfaceParse(words, heads, labels))
        return out


def test_safe_parse_isolates_failures():
    sentences = [["a", "b"], ["boom", "c"], [], ["short", "d", "e"], ["x"] * 5, ["a", ""], ["c"]]
    out = parsers.safe_parse(Flaky(), sentences, max_words=4)
    assert out[0].heads == [0, 1] and out[0].fallback is None
    assert out[1].heads == [0, 0] and out[1].fallback == "error: RuntimeError"
    assert out[2].fallback == "empty" and out[2].heads == []
    assert out[3].heads == [0, 0, 0] and out[3].fallback.startswith("misaligned")
    assert out[4].fallback == "too long" and out[4].heads == [0] * 5 and out[4].labels == ["_"] * 5
    assert out[5].fallback == "empty"
    assert out[6].heads == [0] and out[6].fallback is None


def test_safe_parse_refuses_misaligned_labels_self_loops_and_heads_past_the_sentence():
    """What a parser returns is checked before it is used: as many labels as words, every head 0..n and no word
    its own head; anything else gets the fallback graph. A sentence of exactly --max-words words is parsed."""
    sentences = [["unlabelled", "a", "b"], ["loop", "a", "b"], ["beyond", "a", "b"], ["a", "b", "c", "d"]]
    out = parsers.safe_parse(Flaky(), sentences, max_words=4)
    assert out[0].fallback == "misaligned (3 heads and 2 labels for 3 words)" and out[0].labels == ["_"] * 3
    assert out[1].fallback == out[2].fallback == "head out of range"
    assert out[1].heads == out[2].heads == [0, 0, 0]
    assert out[3].fallback is None and out[3].heads == [0, 1, 2, 3]


def test_fallbacks_counted_in_side_files_and_summary(tmp_path, caplog, capsys):
    parsers.BACKENDS.setdefault("flaky", Flaky)
    (tmp_path / "train.en").write_text("a b@@ c\nboom x\nshort y z\nd\n")
    with caplog.at_level("INFO", logger="umst_plugin.preprocess"):
        rc = cli.main(["-s", "en", "-t", "de", "--trainpref", str(tmp_path / "train"), "--destdir",
                       str(tmp_path / "bin"), "--parser", "flaky", "--no-check-binarized", "--chunk-size", "2"])
    assert rc == 0
    progress = capsys.readouterr().err
    assert "parsing train: 100%" in progress and "4/4" in progress and "sent/s" in progress
    assert (tmp_path / "bin" / "train.en.heads").read_text() == "0 1\n0 0\n0 0 0\n0\n"
    assert (tmp_path / "bin" / "train.en.labels").read_text() == "x x\n_ _\n_ _ _\nx\n"
    assert (tmp_path / "bin" / "train.en.wordids").read_text() == "1 2 2\n1 2\n1 2 3\n1\n"
    summary = [r.message for r in caplog.records if r.message.startswith("summary:")]
    assert summary and "4 sentences, 8 words, 9 subwords, 2 fallback graphs (error: RuntimeError: 1, " \
        "misaligned: 1)" in summary[0]


# ---- spaCy on real English --------------------------------------------------------------------------

# Moses-tokenized (with its escapes) and BPE'd (subword-nmt '@@ ') English.
ENGLISH_BPE = """The cat sat on the mat .
He said &quot; no &quot; to the new pro@@ posal .
I don &apos;t think the commit@@ tee will agree .
AT &amp; T re@@ ported higher prof@@ its in the third quarter .
The price is &lt; 5 dollars and &gt; 2 dollars .
Use the pipe &#124; character in the sh@@ ell .
The results &#91; see table 2 &#93; were sur@@ pr@@ ising .
She gave the children three small books yesterday .
Par@@ liament approved the budget on Tuesday .
The company &apos;s chief executive resigned last week .
We must protect the environ@@ ment for future generations .
Mr. Smith &apos;s dog barked loudly at the post@@ man .
"""


@pytest.fixture(scope="module")
def spacy_parsed(tmp_path_factory):
    e2e.skip_without_spacy_model()
    d = tmp_path_factory.mktemp("spacy")
    (d / "train.en").write_text(ENGLISH_BPE)
    assert cli.main(["-s", "en", "-t", "de", "--trainpref", str(d / "train"), "--destdir", str(d / "bin"),
                     "--parser", "spacy", "--no-check-binarized", "--no-progress", "--chunk-size", "5"]) == 0
    read = lambda kind: [line.split() for line in (d / "bin" / f"train.en.{kind}").read_text().splitlines()]
    return d, read("wordids"), read("heads"), read("labels")


def test_spacy_side_files_align_with_bpe(spacy_parsed):
    d, wordids, heads, labels = spacy_parsed
    bpe = [line.split() for line in ENGLISH_BPE.splitlines()]
    assert len(wordids) == len(heads) == len(labels) == 12
    for pieces, ids, hs, ls in zip(bpe, wordids, heads, labels):
        ids = list(map(int, ids))
        assert len(ids) == len(pieces)
        n_words = sum(not p.endswith("@@") for p in pieces)
        assert ids[-1] == n_words == len(hs) == len(ls)
        assert all(0 <= int(h) <= n_words for h in hs)
        assert sum(int(h) == 0 for h in hs) == 1  # one tree per line


def test_spacy_known_heads(spacy_parsed):
    _, _, heads, labels = spacy_parsed
    h = [list(map(int, x)) for x in heads]
    assert h[0] == [2, 3, 0, 3, 6, 4, 3]  # The->cat, cat->sat, sat=root, on->sat, the->mat, mat->on, .->sat
    assert labels[0][1] == "nsubj" and labels[0][2] == "ROOT"
    # escapes are undone for the parser: &quot; is punctuation; BPE'd "proposal" is one word, object of "to"
    assert labels[1][2] == labels[1][4] == "punct"
    assert h[1][0] == 2 and labels[1][1] == "ROOT"
    assert h[1][8] == 6 and labels[1][8] == "pobj"
    # &apos;s is read as the possessive 's of "company" / "Smith"
    assert h[9][2] == 2 and labels[9][2] == "case"
    assert h[11][2] == 2 and labels[11][2] == "case"
    # "Parliament" (two BPE pieces) is the subject of "approved"
    assert h[8][0] == 2 and labels[8][0] == "nsubj"


def test_spacy_backend_as_the_task_builds_it():
    e2e.skip_without_spacy_model()
    backend = parsers.build_backend("spacy", Namespace(parser_model="en_core_web_md", batch_size=7))
    [p] = backend.parse([["The", "dog", "barked", "."]])
    assert p.heads == [2, 3, 0, 3]
    assert backend.batch_size == 7  # --batch-size reaches spaCy's nlp.pipe


def test_spacy_missing_model_message():
    pytest.importorskip("spacy")
    with pytest.raises(ParserSetupError, match=r"python -m spacy download xx_no_such_model"):
        parsers.build_backend("spacy", Namespace(parser_model="xx_no_such_model", device="cpu"))


def test_a_spacy_pipeline_without_a_parser_is_refused(tmp_path):
    """A pipeline that loads but has no dependency parser (a blank or NER-only one) stops set-up, naming its
    components, before any sentence is parsed into fallback graphs."""
    spacy = pytest.importorskip("spacy")
    from umst_plugin.preprocess.spacy_backend import load_pipeline

    blank = spacy.blank("en")
    blank.add_pipe("sentencizer")
    blank.to_disk(tmp_path / "blank_en")
    with pytest.raises(ParserSetupError, match=r"has no dependency parser \(components: sentencizer\); expected one "
                                               r"with a 'parser'"):
        load_pipeline(str(tmp_path / "blank_en"))


TINY_MODEL = dict(encoder_layers=1, decoder_layers=1, encoder_embed_dim=8, decoder_embed_dim=8,
                  encoder_ffn_embed_dim=8, decoder_ffn_embed_dim=8, encoder_attention_heads=1,
                  decoder_attention_heads=1)


def tiny_task(vocabulary, arch="umst_base", **task_options):
    """A tiny ``arch`` and its multiscale_translation task over a dictionary of ``vocabulary`` (space-separated
    symbols), with ``task_options`` (--source-parser ...): the task that prepares raw input, as fairseq-interactive's.
    Returns (model, task, dictionary)."""
    from fairseq.data import Dictionary

    from umst_dev import dev

    dictionary = Dictionary()
    for symbol in vocabulary.split():
        dictionary.add_symbol(symbol)
    model, task = dev.build_model(arch, {**task_options, **TINY_MODEL}, dictionary=dictionary)
    return model, task, dictionary


def token_row(dictionary, sentence):
    """The ids of ``sentence``'s space-separated symbols and </s>, a list."""
    return [dictionary.index(s) for s in sentence.split()] + [dictionary.eos()]


def test_task_parses_interactive_input_with_spacy():
    """The task's --source-parser spacy path (fairseq-interactive) through build_backend(Namespace(parser_model))."""
    e2e.skip_without_spacy_model()
    import torch

    _, task, d = tiny_task("The c@@ at sat on the mat . &quot; no", arch="transformer", source_parser="spacy",
                           source_parser_model="en_core_web_md")
    tokens = torch.tensor(token_row(d, "The c@@ at sat on the mat ."))
    item = task.build_dataset_for_inference([tokens], [len(tokens)])[0]
    assert item["src_word_ids"].tolist() == [1, 2, 2, 3, 4, 5, 6, 7, 8]
    assert item["src_word_heads"].tolist() == [2, 3, 0, 3, 6, 4, 3, 0]  # "cat" rebuilt from c@@ at


@needs_stanza
def test_the_recorded_stanza_package_reaches_the_parser_of_raw_input(tmp_path, monkeypatch):
    """A data-bin parsed by stanza with --stanza-package: from_pretrained's recorded parser keeps the package, so
    raw input is parsed by the model that parsed the training text, not by stanza's default package. (No stanza
    model can be downloaded here: the parser's own error names the package it looked for.)"""
    import json

    import torch

    from umst_plugin import hub
    from umst_plugin import text_preprocessing as textprep

    monkeypatch.setenv("STANZA_RESOURCES_DIR", str(tmp_path / "stanza"))
    db = tmp_path / "data-bin"
    db.mkdir()
    (db / "bpe.codes").write_text("#version: 0.2\n")
    (db / "source-parse.json").write_text(json.dumps({"parser": "stanza", "model": "en", "stanza_package": "gum",
                                                      "written_by": "umst-preprocess"}))
    textprep.write_record(str(db), ["en", "de"], lowercase=True, bpe_codes="bpe.codes")
    record = textprep.read_record(str(db))
    assert (record.source_parser, record.source_parser_model, record.source_parser_package) == ("stanza", "en", "gum")

    model, task, d = tiny_task("the cat sat .")
    task.text_record = record
    assert hub.use_recorded_parser(task, [model], given=False) == ("stanza", "en")
    assert task.cfg.source_parser_package == "gum"
    tokens = torch.tensor(token_row(d, "the cat sat ."))
    with pytest.raises(ParserSetupError, match=re.escape(f"model_dir='{tmp_path / 'stanza'}'") + r".*package='gum'"):
        task.build_dataset_for_inference([tokens], [len(tokens)])


def test_interactive_input_is_parsed_once_per_sentence_whatever_its_padding():
    """fairseq-interactive hands the task each batch twice (build_dataset_for_inference, then inference_step with
    the side inputs dropped): each distinct sentence is parsed once, keyed by its words without </s> and padding, so
    the same sentence padded to another length in another batch is not parsed again and gets the same heads."""
    e2e.skip_without_spacy_model()
    import torch

    _, task, d = tiny_task("The cat sat on the mat . A dog ran", source_parser="spacy",
                           source_parser_model="en_core_web_md")
    cat, dog = token_row(d, "The cat sat on the mat ."), token_row(d, "A dog ran .")
    parsed = []
    first = task._parse_tokens(torch.tensor([cat, cat]))  # the backend is built here, on first use
    backend = task._parser
    parse = backend.parse
    backend.parse = lambda sentences: parsed.append(list(sentences)) or parse(sentences)
    left_padded = torch.tensor([cat, [d.pad()] * 3 + dog])
    again = task._parse_tokens(left_padded)
    assert task._parser is backend  # built once
    assert parsed == [[["A", "dog", "ran", "."]]]  # only the new sentence; "cat" came from the cache
    assert again[0].tolist() == first[0].tolist() == first[1].tolist() == [2, 3, 0, 3, 6, 4, 3]
    assert again[1].tolist() == [2, 3, 0, 3]
    task._parse_tokens(torch.tensor([dog + [d.pad()] * 3]))  # right-padded this time
    assert len(parsed) == 1


def test_interactive_input_without_a_parser_warns_once(caplog):
    """--source-parser none (the default): raw input gets the fallback graph, and one warning says so and how to
    parse instead, not one per batch."""
    import logging

    import torch

    _, task, d = tiny_task("the cat sat")
    tokens = torch.tensor(token_row(d, "the cat sat"))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            item = task.build_dataset_for_inference([tokens], [len(tokens)])[0]
            assert item["src_word_heads"].tolist() == [0, 0, 0, 0]
    warnings = [r.getMessage() for r in caplog.records if "no --source-parser configured" in r.getMessage()]
    assert len(warnings) == 1 and "Set --source-parser (e.g. spacy or stanza)" in warnings[0], caplog.text


def test_the_task_s_source_parser_model_reaches_the_parser(tmp_path):
    """--source-parser-model names the pipeline raw input is parsed with: one that is not there stops with its
    name, not with spaCy's default pipeline taken instead."""
    e2e.skip_without_spacy_model()
    import torch

    missing = str(tmp_path / "no-such-pipeline")
    _, task, d = tiny_task("the cat sat", source_parser="spacy", source_parser_model=missing)
    tokens = torch.tensor(token_row(d, "the cat sat"))
    with pytest.raises(ParserSetupError, match=re.escape(missing)):
        task.build_dataset_for_inference([tokens], [len(tokens)])
