"""Raw text at inference is prepared as the training text was (docs/inference.md).

scripts/prepare-multi30k.sh (lowercased, Moses without -a, joint BPE) runs on a few hundred lines of the
real Multi30k files (the toy corpus under their names where ../shared is absent) and records its text
preprocessing in DATA_BIN/preprocessing.json. A tiny model of each family trains a few updates on it.
Then, for every family:

* raw cased text encodes to exactly the ids its lowercased, tokenized form has in the data-bin
  (``from_pretrained(...).encode``, with and without the usual fairseq arguments, and fairseq-interactive's
  S- line, for the cased and the lowercased sentence);
* ``from_pretrained(...).translate``, fairseq-interactive and fairseq-generate give the same hypothesis
  (tokens, score, detokenized text) for the same test sentence; UMST parses on the fly with spaCy, the parser
  the data-bin's record names (no parser argument to from_pretrained); ``translate`` decodes with
  scripts/evaluate.sh's beam 4 and lenpen 0.6 unless told otherwise.

And: the record reproduces the recipe's tokenize + BPE line by line, arguments that contradict it stop
with the conflict named, a data-bin without a record warns, a broken record names the file and what was
expected, umst-inspect --sentence uses the record, and re-running the recipe records an older data-bin.
"""
import importlib
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import e2e
import recipe_toy
from umst_plugin import text_preprocessing as textprep

ROOT = e2e.ROOT
MERGES = 300
SRC, TGT = "en", "de"
TEST_RAW = "test_2016_flickr.en.gz"  # fairseq's "test" split of the recipe
DOGS = "Two dogs are running through the snow."  # the sentence of issue #20
BEAM, MAX_LEN_B = 2, 12

TINY = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--share-all-embeddings"]
# family -> (model class, arch, tiny flags)
FAMILIES = {
    "umst": ("umst_plugin.models.umst:UMSTModel", "umst_base", TINY),
    "transformer_sf": ("umst_plugin.models.transformer_sf:TransformerSlowFastModel", "transformer_sf_base",
                       TINY + ["--fast-embed-dim", "8", "--fast-ffn-embed-dim", "16", "--fast-attention-heads", "2"]),
    "msc": ("umst_plugin.models.msc:MSCModel", "msc_iwslt_de_en",
            TINY[4:] + ["--encoder-blocks", "2", "--encoder-layers-per-block", "1", "--decoder-layers", "2"]),
    "msmsa": ("umst_plugin.models.msmsa:MSMSAModel", "msmsa_base",
              TINY + ["--msmsa-scales", "1,3,N/4,N/2", "--msmsa-min-block", "2"]),
    "prime": ("umst_plugin.models.prime:PrimeModel", "prime_base", TINY + ["--prime-kernels", "3,7"]),
}
# UMST parses interactive input on the fly with the parser the recipe used (from_pretrained reads it from the
# data-bin's record: no argument)
PARSER = {"umst": dict(source_parser="spacy", source_parser_model="en_core_web_md")}
LENPEN = 0.6  # scripts/evaluate.sh's default, and translate()'s


def model_class(family):
    module, name = FAMILIES[family][0].split(":")
    return getattr(importlib.import_module(module), name)


def parser_flags(family):
    return [f"--{k.replace('_', '-')}={v}" for k, v in PARSER.get(family, {}).items()]


def recipe_env(sources):
    return e2e.recipe_env(MULTI30K_SOURCES=sources)


@pytest.fixture(scope="module")
def m30k(multi30k_standin):
    """The recipe's data-bin (built once per test run: tests/conftest.py's ``multi30k_standin``, which
    test_recipes.py reads too), its raw test sources, and a sentence to probe."""
    assert recipe_toy.MULTI30K_MERGES == MERGES
    test_raw = recipe_toy.read_gz(os.path.join(multi30k_standin["raw"], TEST_RAW))
    # the sentence on real captions; on the toy stand-in (no ../shared) a test source, capitalised
    probe = DOGS if multi30k_standin["origin"] == "shared" else test_raw[0][:1].upper() + test_raw[0][1:]
    return dict(multi30k_standin, test_raw=test_raw, probe=probe)


@pytest.fixture(scope="module")
def checkpoints(m30k, tmp_path_factory):
    """family -> save dir with checkpoint_last.pt, each trained 12 updates."""
    out = {}
    for family, (_, arch, flags) in FAMILIES.items():
        save_dir = str(tmp_path_factory.mktemp(f"ckpt_{family}"))
        e2e.train(m30k["databin"], save_dir, arch, *flags, max_update=12, lr="5e-3")
        out[family] = save_dir
    return out


def databin_source_ids(databin, index):
    """The binarized source of test sentence ``index`` (what fairseq-generate feeds the model)."""
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(os.path.join(databin, f"test.{SRC}-{TGT}.{SRC}"), None)
    return dataset[index].long()


def load_hub(family, save_dir, databin, **kwargs):
    return model_class(family).from_pretrained(save_dir, checkpoint_file="checkpoint_last.pt",
                                               data_name_or_path=databin, **kwargs)


def output_lines(text, kind):
    """{sentence id: fields after the id} of fairseq's S/T/H/D lines."""
    return {int(m.group(1)): m.group(2).split("\t") for m in re.finditer(rf"^{kind}-(\d+)\t(.*)$", text, flags=re.M)}


# ---- the record and the recipe ----------------------------------------------------------------------

def test_multi30k_recipe_records_its_preprocessing(m30k):
    db = m30k["databin"]
    with open(os.path.join(db, textprep.RECORD_NAME), encoding="utf-8") as f:
        data = json.load(f)
    assert data["lowercase"] is True and data["languages"] == [SRC, TGT]
    assert data["tokenizer"] == {"name": "moses", "aggressive_dash_splits": False, "escape": True}
    assert data["normalisation"] == {"moses_punctuation": True, "remove_non_printing": True, "romanian": []}
    assert data["bpe"]["name"] == "subword_nmt" and data["bpe"]["codes"] == "bpe.codes"
    assert data["bpe"]["merges"] == MERGES and data["bpe"]["codes_sha256"] == textprep.sha256_file(
        os.path.join(db, "bpe.codes"))
    assert data["written_by"] == "scripts/prepare-multi30k.sh"
    # what parsed the source side: the recipe's --parser spacy --parser-model en_core_web_md
    assert data["source_parse"] == {"parser": "spacy", "model": "en_core_web_md", "written_by": "umst-preprocess"}
    # the no-parse variant (another data-bin of the same text) carries the same text steps, and no parser
    variant = textprep.read_record(db + "_noparse")
    assert variant.lowercase and variant.bpe_codes_sha256 == data["bpe"]["codes_sha256"]
    assert (variant.source_parser, variant.source_parser_model) == ("none", None)


def test_record_reproduces_the_recipe_line_by_line(m30k):
    """Every raw test line, prepared by the record, is the recipe's tokenized and BPE'd line."""
    record = textprep.read_record(m30k["databin"])
    bpe = textprep.build_bpe(record, None)
    for lang in (SRC, TGT):
        prepare = record.preparer(lang)
        raw = recipe_toy.read_gz(os.path.join(m30k["raw"], f"test_2016_flickr.{lang}.gz"))
        with open(os.path.join(m30k["work"], "tok", f"test.{lang}"), encoding="utf-8") as f:
            tok = f.read().splitlines()
        with open(os.path.join(m30k["work"], f"bpe{MERGES}", f"test.{lang}"), encoding="utf-8") as f:
            bpe_lines = f.read().splitlines()
        assert len(raw) == len(tok) == len(bpe_lines) == 40
        assert [prepare(line) for line in raw] == tok
        assert [bpe.encode(prepare(line)) for line in raw] == bpe_lines
    if m30k["origin"] == "shared":  # real captions are cased; the record lowercases them
        assert any(c.isupper() for c in m30k["test_raw"][0])


def test_record_steps_match_wmt_prep_tokenize(tmp_path):
    """LinePreparer as a record configures it = scripts/wmt_prep.py tokenize with the recipe's flags
    (punctuation, non-printing characters, Romanian, escapes, dashes, case)."""
    lines = ["\u015ei \u0163ara \u201eM\u00e2ine\u201d \u2014 \u00een 2016: \u015etefan-cel-Mare & <b>\tx\x07y",
             "  Two dogs are running through the snow.  ", 'A well-known "test" | [x] it\'s \u00c2\u00ce']
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    db = tmp_path / "db"
    db.mkdir()
    (db / "bpe.codes").write_text("#version: 0.2\nt h\n", encoding="utf-8")
    cases = [("en", ["--lowercase", "--no-aggressive-dashes"], dict(lowercase=True, aggressive_dash_splits=False)),
             ("en", [], dict(lowercase=False)),
             ("ro", ["--romanian"], dict(lowercase=False, romanian=["ro"]))]
    for lang, flags, record_args in cases:
        out = tmp_path / "out.txt"
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "wmt_prep.py"), "tokenize", "--lang", lang,
                        *flags, str(src), str(out)], check=True, capture_output=True)
        textprep.write_record(str(db), ["en", "ro"], bpe_codes="bpe.codes", **record_args)
        prepare = textprep.read_record(str(db)).preparer(lang)
        assert [prepare(line) for line in lines] == out.read_text(encoding="utf-8").splitlines(), (lang, flags)
    assert prepare(lines[0]).startswith("Si tara &quot; Maine &quot; - in 2016 : Stefan @-@ cel @-@ Mare")


def test_the_text_tool_loads_the_plugins_preprocessing_without_fairseq():
    """scripts/wmt_prep.py runs once per file and step of a prepare (tens of times): it loads the plugin's
    text_preprocessing.py on its own, not through the plugin's __init__ (fairseq and every arch: 18 s a process)."""
    code = ("import sys, umst_tools.wmt_prep as w; "
            "print(sorted(m for m in ('fairseq', 'torch', 'umst_plugin') if m in sys.modules), w.textprep.__file__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["[]", os.path.join(ROOT, "umst_plugin", "text_preprocessing.py")], proc.stdout


def test_tokenize_without_sacremoses_stops_with_a_clear_error(tmp_path):
    """Parallel tokenization in a Python without sacremoses: an error naming the file and the fix, at once
    (a Pool whose workers fail to set up would restart them forever), and no output file."""
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("a dog .\n", encoding="utf-8")
    code = ("import runpy, sys; sys.modules['sacremoses'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "scripts", "wmt_prep.py"), "tokenize",
                           "--lang", "en", "--workers", "2", str(src), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and f"{src}: cannot tokenize: " in proc.stderr and "sacremoses" in proc.stderr, \
        proc.stderr[-2000:]
    assert not out.exists() and not os.path.exists(str(out) + ".tmp")


def test_rerunning_the_recipe_records_an_older_databin(m30k, tmp_path):
    """A data-bin made before records existed: re-running the recipe with the same arguments skips every
    stage and writes the record, the parser's included (and the no-parse variant's own record). (On a copy of
    the work dir: the test run's other tests read the original.)"""
    work = tmp_path / "work"
    shutil.copytree(m30k["work"], work, symlinks=True)
    db = os.path.join(work, os.path.relpath(m30k["databin"], m30k["work"]))
    record = os.path.join(db, textprep.RECORD_NAME)
    with open(record, encoding="utf-8") as f:
        before = f.read()
    os.remove(record)
    os.remove(os.path.join(db + "_noparse", textprep.RECORD_NAME))
    # parsed before umst-preprocess recorded its parser too: the re-run writes that record without parsing
    os.remove(os.path.join(db, "source-parse.json"))
    cmd = list(m30k["cmd"])
    cmd[cmd.index("--work-dir") + 1] = str(work)
    proc = subprocess.run(cmd, env=recipe_env(m30k["sources"]), cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for stage in ("extract", "tokenize", "clean", "binarize", "no-parse variant"):
        assert re.search(rf"\] {stage}[^\n]*: done before", proc.stderr), (stage, proc.stderr[-3000:])
    with open(record, encoding="utf-8") as f:
        assert f.read() == before
    variant = textprep.read_record(db + "_noparse")
    assert variant.lowercase and variant.source_parser == "none"


# ---- every family: the same ids and the same hypothesis through every path ---------------------------

@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_raw_text_reaches_the_model_as_in_training(family, m30k, checkpoints):
    db, save_dir = m30k["databin"], checkpoints[family]
    raw = m30k["test_raw"][0]
    expected = databin_source_ids(db, 0)
    hub = load_hub(family, save_dir, db)
    assert type(hub).__name__ == "RawTextHubInterface"
    # the parser comes from the data-bin's record, for the family that reads dependency heads only
    parser = PARSER.get(family, dict(source_parser="none", source_parser_model=""))
    assert (hub.task.cfg.source_parser, hub.task.cfg.source_parser_model) == tuple(parser.values())
    # raw cased text -> the ids of its lowercased, tokenized form in the data-bin
    assert torch.equal(hub.encode(raw), expected), (hub.string(hub.encode(raw)), hub.string(expected))
    assert torch.equal(hub.encode(raw.lower()), expected)
    dogs = hub.encode(m30k["probe"])
    assert torch.equal(dogs, hub.encode(m30k["probe"].lower())) and hub.src_dict.unk() not in dogs.tolist()
    # the usual fairseq arguments agree with the record and give the same ids
    explicit = load_hub(family, save_dir, db, tokenizer="moses", bpe="subword_nmt",
                        bpe_codes=os.path.join(db, "bpe.codes"))
    assert torch.equal(explicit.encode(raw), expected) and torch.equal(explicit.encode(m30k["probe"]), dogs)

    best = hub.generate([expected], beam=BEAM, max_len_b=MAX_LEN_B, lenpen=LENPEN)[0][0]
    # fairseq-interactive and fairseq-generate print scores in base 2
    hub_bpe, hub_score = hub.tgt_dict.string(best["tokens"]), float(best["score"]) / math.log(2)
    translation = hub.translate(raw, beam=BEAM, max_len_b=MAX_LEN_B)  # lenpen: evaluate.sh's 0.6
    assert translation == hub.decode(best["tokens"]) == translation.lower()  # lowercased recipe: lowercase out
    assert hub.translate([raw, m30k["probe"]], beam=BEAM, max_len_b=MAX_LEN_B)[0] == translation
    if family == "umst":  # translate()'s defaults are evaluate.sh's: beam 4, lenpen 0.6
        default = hub.generate([expected], beam=4, max_len_b=MAX_LEN_B, lenpen=LENPEN)[0][0]
        assert hub.translate(raw, max_len_b=MAX_LEN_B) == hub.decode(default["tokens"])
        # a parser given wins over the record's
        assert load_hub(family, save_dir, db, source_parser="none").task.cfg.source_parser == "none"

    flags = ["--beam", BEAM, "--lenpen", LENPEN, "--max-len-b", MAX_LEN_B, *parser_flags(family)]
    out = e2e.fairseq("interactive", db, "--user-dir", e2e.PLUGIN, "--task", "multiscale_translation", "--path",
                      os.path.join(save_dir, "checkpoint_last.pt"), *flags,
                      input="\n".join([raw, raw.lower(), m30k["probe"], m30k["probe"].lower()]) + "\n").stdout
    sources, hyps, detoks = output_lines(out, "S"), output_lines(out, "H"), output_lines(out, "D")
    assert sources[0] == sources[1] == [hub.src_dict.string(expected)], out[-3000:]
    assert sources[2] == sources[3] == [hub.src_dict.string(dogs)]
    assert hyps[0] == hyps[1] and hyps[2] == hyps[3] and detoks[0] == detoks[1]
    assert hyps[0][1] == hub_bpe and detoks[0][1] == translation
    assert float(hyps[0][0]) == pytest.approx(hub_score, abs=1e-4)
    if family == "umst":  # fairseq-interactive with the usual arguments, which agree with the record
        explicit_out = e2e.fairseq(
            "interactive", db, "--user-dir", e2e.PLUGIN, "--task", "multiscale_translation", "--path",
            os.path.join(save_dir, "checkpoint_last.pt"), *flags, "--source-lang", SRC, "--target-lang", TGT,
            "--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", os.path.join(db, "bpe.codes"),
            input=f"{raw}\n{m30k['probe']}\n").stdout
        assert output_lines(explicit_out, "S") == {0: sources[0], 1: sources[2]}, explicit_out[-3000:]
        assert output_lines(explicit_out, "H") == {0: hyps[0], 1: hyps[2]}

    out = e2e.fairseq("generate", db, "--user-dir", e2e.PLUGIN, "--task", "multiscale_translation", "--path",
                      os.path.join(save_dir, "checkpoint_last.pt"), "--gen-subset", "test", "--batch-size", "1",
                      *flags).stdout
    hyps, detoks = output_lines(out, "H"), output_lines(out, "D")
    assert len(hyps) == 40, out[-3000:]
    assert hyps[0][1] == hub_bpe and detoks[0][1] == translation
    assert float(hyps[0][0]) == pytest.approx(hub_score, abs=1e-4)


# ---- arguments that contradict the record, a missing record, a broken record -------------------------

def test_contradicting_arguments_stop_naming_them(m30k, checkpoints):
    db, save_dir = m30k["databin"], checkpoints["msmsa"]
    record_path = os.path.join(db, textprep.RECORD_NAME)
    with pytest.raises(textprep.PreprocessingMismatch) as info:
        load_hub("msmsa", save_dir, db, tokenizer="space")
    assert f"{record_path} records how the model's training text was prepared" in str(info.value)
    assert "tokenizer: recorded 'moses', given 'space'" in str(info.value)
    other_codes = os.path.join(m30k["work"], f"bpe{MERGES}", "test.en")  # a file, not these codes
    with pytest.raises(textprep.PreprocessingMismatch, match=r"bpe_codes: given .*test\.en, whose content differs"):
        load_hub("msmsa", save_dir, db, bpe="subword_nmt", bpe_codes=other_codes)
    # Moses options switched away from fairseq's defaults against a record that has them
    record = textprep.read_record(db)
    from argparse import Namespace

    assert textprep.tokenizer_conflicts(record, Namespace(tokenizer="moses", moses_no_escape=True)) == [
        "moses_no_escape: recorded Moses escaping, given moses_no_escape=True"]
    record.aggressive_dash_splits = True
    assert "moses_no_dash_splits" in textprep.tokenizer_conflicts(
        record, Namespace(tokenizer="moses", moses_no_dash_splits=True))[0]
    # text_preprocessing='arguments' ignores the record: fairseq's behaviour, the issue's <unk>
    plain = load_hub("msmsa", save_dir, db, tokenizer="moses", bpe="subword_nmt",
                     bpe_codes=os.path.join(db, "bpe.codes"), text_preprocessing="arguments")
    assert plain.src_dict.string(plain.encode(DOGS)).startswith("<unk>")


def test_missing_record_warns_and_says_how_to_add_one(m30k, checkpoints, tmp_path, caplog):
    old = tmp_path / "old-data-bin"  # a data-bin as recipes made them before the record
    old.mkdir()
    for name in os.listdir(m30k["databin"]):
        if name != textprep.RECORD_NAME:
            os.symlink(os.path.join(m30k["databin"], name), old / name)
    hub = load_hub("prime", checkpoints["prime"], str(old))
    with caplog.at_level("WARNING"):
        ids = hub.encode(DOGS)
    assert f"{old} has no preprocessing.json" in caplog.text
    assert "re-running the recipe with the same arguments" in caplog.text and "docs/inference.md" in caplog.text
    assert hub.src_dict.string(ids).startswith("<unk>")  # nothing lowercased it


def test_broken_record_names_the_file_and_what_was_expected(m30k, tmp_path):
    db = tmp_path / "db"
    shutil.copytree(m30k["databin"], db, symlinks=True)
    path = db / textprep.RECORD_NAME
    good = json.loads(path.read_text(encoding="utf-8"))

    def expect(data, pattern):
        path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
        with pytest.raises(textprep.RecordError, match=pattern) as info:
            textprep.read_record(str(db))
        assert str(info.value).startswith(f"{path}: ")

    expect("{not json", r"not valid JSON .*expected the record a recipe writes")
    expect({**good, "format": "other"}, r'expected a JSON object with "format": "umst_plugin text preprocessing"')
    expect({**good, "lowercase": "yes"}, r'"lowercase" is \'yes\'; expected a bool')
    expect({**good, "tokenizer": {**good["tokenizer"], "name": "nltk"}}, r'"tokenizer.name" .*moses, none')
    expect({**good, "bpe": {**good["bpe"], "codes": "missing.codes"}}, r"missing.codes, do not exist")
    expect({**good, "bpe": {**good["bpe"], "codes_sha256": "0" * 64}}, r"the codes changed after the data-bin")
    path.write_text(json.dumps(good), encoding="utf-8")
    with pytest.raises(textprep.RecordError, match=r"records languages \['en', 'de'\], not 'fr'"):
        textprep.read_record(str(db)).preparer("fr")
    # the task stops at set-up, naming the file
    path.write_text("[]", encoding="utf-8")
    from umst_plugin.tasks.multiscale_translation import MultiscaleTranslationConfig, MultiscaleTranslationTask

    with pytest.raises(textprep.RecordError, match=re.escape(str(path))):
        MultiscaleTranslationTask.setup_task(MultiscaleTranslationConfig(data=str(db), source_lang=SRC,
                                                                         target_lang=TGT))


def test_inspect_sentence_uses_the_record(m30k, tmp_path):
    pytest.importorskip("matplotlib")
    from umst_plugin import inspect as umst_inspect

    result = umst_inspect.run([m30k["databin"], "--sentence", m30k["probe"], "--source-parser", "none", "--output",
                               str(tmp_path / "dogs.png"), "--dpi", "40"])
    assert result.source.words[:2] == m30k["probe"].lower().split()[:2] and "<unk>" not in "".join(result.source.words)
