"""``umst_plugin.from_pretrained``: one loader for every checkpoint (umst_plugin/hub.py, docs/inference.md).

On the toy corpus with a recorded, lowercasing preprocessing (``preprocessing.json``: Moses, lowercase, the
corpus's BPE codes), two checkpoints load through the same function:

* fairseq's own ``--arch transformer`` trained under fairseq's ``--task translation`` with ``--amp
  --amp-dtype bfloat16`` (a baseline row): cased text encodes exactly as its lowercased form, which is the
  binarized test sentence, and ``translate`` runs; fairseq's own ``TransformerModel.from_pretrained`` with the
  same tokenizer and BPE turns the capitals into ``<unk>``. Decoding runs in fp32 unless ``amp=True``, then in
  the checkpoint's bf16 or the ``amp_dtype`` asked for (the output projection's dtype);
* a plugin architecture (Prime-simple) trained under ``--task multiscale_translation``: the same ids, the same
  translation as its class's ``from_pretrained``.
"""
import os
import shutil

import pytest
import torch

import e2e
import umst_plugin
from fairseq.hub_utils import GeneratorHubInterface
from umst_plugin import text_preprocessing as textprep

SRC = e2e.SRC


@pytest.fixture(scope="module")
def recorded_databin(toy_raw, toy_databin, tmp_path_factory):
    """The toy data-bin with a record: Moses, lowercasing, the corpus's BPE codes."""
    databin = str(tmp_path_factory.mktemp("loader") / "data-bin")
    shutil.copytree(toy_databin, databin)
    shutil.copy(os.path.join(toy_raw, "bpe.codes"), os.path.join(databin, "bpe.codes"))
    textprep.write_record(databin, [e2e.SRC, e2e.TGT], lowercase=True, bpe_codes="bpe.codes", merges=400,
                          written_by="tests/test_loader.py")
    return databin


@pytest.fixture(scope="module")
def checkpoints(recorded_databin, tmp_path_factory):
    out = {}
    save = str(tmp_path_factory.mktemp("transformer"))
    e2e.train(recorded_databin, save, "transformer", "--cpu", *e2e.TINY, "--amp", "--amp-dtype", "bfloat16",
              task="translation", max_update=6)
    out["transformer"] = save
    save = str(tmp_path_factory.mktemp("prime_simple"))
    e2e.train(recorded_databin, save, "prime_simple_base", "--cpu", *e2e.TINY, max_update=6)
    out["prime_simple"] = save
    return out


def first_test_sentence(toy_raw):
    """The first word-tokenized test source, and a cased form of it (capitalised words)."""
    with open(os.path.join(toy_raw, f"test.tok.{SRC}"), encoding="utf-8") as f:
        line = f.readline().strip()
    words = line.split()
    cased = " ".join(w.capitalize() if i % 2 == 0 else w.upper() if i == 1 else w for i, w in enumerate(words))
    assert cased != line and cased.lower() == line
    return line, cased


def binarized_source(databin, index=0):
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(os.path.join(databin, f"test.{SRC}-{e2e.TGT}.{SRC}"), None)
    return dataset[index].long()


def load(save_dir, databin, **kwargs):
    return umst_plugin.from_pretrained(save_dir, checkpoint_file="checkpoint_last.pt", data_name_or_path=databin,
                                       cpu=True, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("row", ["transformer", "prime_simple"])
def test_cased_text_encodes_as_its_lowercased_form(row, toy_raw, recorded_databin, checkpoints):
    line, cased = first_test_sentence(toy_raw)
    hub = load(checkpoints[row], recorded_databin)
    assert isinstance(hub, GeneratorHubInterface)  # fairseq's hub interface
    expected = binarized_source(recorded_databin)
    assert torch.equal(hub.encode(cased), expected), (hub.string(hub.encode(cased)), hub.string(expected))
    assert torch.equal(hub.encode(line), expected)
    assert hub.src_dict.unk() not in hub.encode(cased).tolist()
    translation = hub.translate(cased, beam=2, max_len_b=5)
    assert isinstance(translation, str) and translation == hub.translate(line, beam=2, max_len_b=5)
    assert hub.translate([cased, line], beam=2, max_len_b=5) == [translation, translation]


@pytest.mark.slow
def test_fairseqs_own_loader_turns_capitals_into_unk(toy_raw, recorded_databin, checkpoints):
    """What the function fixes: fairseq's TransformerModel.from_pretrained ignores the record."""
    from fairseq.models.transformer import TransformerModel

    _, cased = first_test_sentence(toy_raw)
    plain = TransformerModel.from_pretrained(checkpoints["transformer"], checkpoint_file="checkpoint_last.pt",
                                             data_name_or_path=recorded_databin, tokenizer="moses",
                                             bpe="subword_nmt", bpe_codes=os.path.join(recorded_databin, "bpe.codes"),
                                             cpu=True)
    assert plain.src_dict.unk() in plain.encode(cased).tolist()


@pytest.mark.slow
def test_the_plugin_classes_from_pretrained_is_the_same_loader(toy_raw, recorded_databin, checkpoints):
    from umst_plugin.models.prime.model import PrimeModel

    _, cased = first_test_sentence(toy_raw)
    by_class = PrimeModel.from_pretrained(checkpoints["prime_simple"], checkpoint_file="checkpoint_last.pt",
                                          data_name_or_path=recorded_databin, cpu=True)
    by_function = load(checkpoints["prime_simple"], recorded_databin)
    assert type(by_class) is type(by_function)
    assert torch.equal(by_class.encode(cased), by_function.encode(cased))
    assert by_class.translate(cased, beam=2, max_len_b=5) == by_function.translate(cased, beam=2, max_len_b=5)


def decoding_dtype(hub, sentence):
    seen = []
    handle = hub.models[0].decoder.output_projection.register_forward_hook(
        lambda module, inputs, output: seen.append(output.dtype) and None)
    try:
        hub.translate(sentence, beam=2, max_len_b=3)
    finally:
        handle.remove()
    assert seen and len(set(seen)) == 1, seen
    return seen[0]


@pytest.mark.slow
def test_the_checkpoints_precision_rules_apply(toy_raw, recorded_databin, checkpoints):
    """The transformer was trained under bf16 autocast: decoding is fp32 unless amp=True, then bf16 (the
    checkpoint's --amp-dtype, from common.amp_dtype) or the amp_dtype asked for."""
    _, cased = first_test_sentence(toy_raw)
    save = checkpoints["transformer"]
    assert decoding_dtype(load(save, recorded_databin), cased) == torch.float32
    assert decoding_dtype(load(save, recorded_databin, amp=True), cased) == torch.bfloat16
    assert decoding_dtype(load(save, recorded_databin, amp=True, amp_dtype="float16"), cased) == torch.float16
    # a checkpoint trained in fp32: amp=True means fairseq's float16
    assert decoding_dtype(load(checkpoints["prime_simple"], recorded_databin, amp=True), cased) == torch.float16
    with pytest.raises(ValueError, match="amp_dtype 'float8': expected one of float16, bfloat16"):
        load(save, recorded_databin, amp=True, amp_dtype="float8")


@pytest.mark.slow
def test_raw_input_under_fairseqs_translation_task_notes_the_record_once(toy_raw, recorded_databin, checkpoints,
                                                                          tmp_path, caplog):
    """Under fairseq's plain ``--task translation`` the hub reads the record itself: the first raw sentence logs
    what raw input gets, once (not per sentence); ``text_preprocessing='arguments'`` logs nothing of the record; a
    data-bin without a record warns once that raw input gets the arguments' preparation only. ``translate`` logs no
    sentence unless ``verbose=True``."""
    _, cased = first_test_sentence(toy_raw)
    save = checkpoints["transformer"]
    codes = os.path.join(recorded_databin, "bpe.codes")

    def notes_of(hub):
        caplog.clear()
        with caplog.at_level("INFO"):
            hub.encode(cased)
            hub.encode(cased)
            hub.translate(cased, beam=2, max_len_b=3)
        # translate's default is fairseq's: not verbose (no source and hypothesis lines logged)
        assert not [r for r in caplog.records if r.getMessage().startswith(("S\t", "H\t"))], caplog.text[-2000:]
        return ([r for r in caplog.records if f"raw {SRC} input gets" in r.getMessage()],
                [r for r in caplog.records if "has no preprocessing.json" in r.getMessage()])

    noted, missing = notes_of(load(save, recorded_databin))
    assert len(noted) == 1 and not missing, caplog.text[-2000:]
    assert noted[0].getMessage().startswith(os.path.join(recorded_databin, "preprocessing.json"))
    noted, missing = notes_of(load(save, recorded_databin, text_preprocessing="arguments", tokenizer="moses",
                                   bpe="subword_nmt", bpe_codes=codes))
    assert not noted and not missing, caplog.text[-2000:]
    bare = tmp_path / "data-bin"
    shutil.copytree(recorded_databin, bare)
    os.remove(bare / "preprocessing.json")
    noted, missing = notes_of(load(save, str(bare), tokenizer="moses", bpe="subword_nmt", bpe_codes=codes))
    assert not noted and len(missing) == 1, caplog.text[-2000:]
