"""The decoding benchmark (benchmarks/bench_decode.py) and the synthetic corpus it decodes
(benchmarks/synthetic_corpus.py): the corpus is deterministic, follows Multi30k's lengths and loads under both
tasks with its side files; forced-length decoding yields exactly L tokens; the launch count of a decoding step
is stable; the --quick run end to end."""
import collections
import json
import os
import subprocess
import sys

import pytest

from benchmarks import bench_decode, synthetic_corpus
from umst_dev import dev

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = dict(train=300, valid=20, test=30)
TINY = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32,
            decoder_ffn_embed_dim=32, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_normalize_before=True, decoder_normalize_before=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small synthetic corpus, binarized with 2 workers (umst-preprocess in a forked process)."""
    out = str(tmp_path_factory.mktemp("synthetic"))
    return out, synthetic_corpus.build(out, SIZES, workers=2)


def files_of(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        if name != "preprocess.log":  # fairseq logs its arguments, the paths included
            with open(os.path.join(folder, name), "rb") as f:
                out[name] = f.read()
    return out


def test_corpus_is_deterministic(corpus, tmp_path):
    out, databin = corpus
    again = synthetic_corpus.build(str(tmp_path), SIZES, workers=1)
    assert files_of(os.path.join(out, "raw")) == files_of(os.path.join(str(tmp_path), "raw"))
    assert files_of(databin) == files_of(again)
    other_seed = synthetic_corpus.write_corpus(str(tmp_path / "seed2"), SIZES, seed=2)
    assert other_seed == ["train", "valid", "test"]
    with open(tmp_path / "seed2" / "test.src") as a, open(os.path.join(out, "raw", "test.src")) as b:
        assert a.read() != b.read()


def test_test_split_does_not_depend_on_the_train_size(corpus, tmp_path):
    out, _ = corpus
    synthetic_corpus.write_corpus(str(tmp_path), dict(train=0, valid=0, test=SIZES["test"]))
    for name in ("test.src", "test.tgt", "test.src.conllu"):
        with open(tmp_path / name) as a, open(os.path.join(out, "raw", name)) as b:
            assert a.read() == b.read()
    assert not os.path.exists(tmp_path / "train.src")


def test_lengths_follow_the_file(tmp_path):
    pairs = synthetic_corpus.read_length_pairs()
    synthetic_corpus.write_corpus(str(tmp_path), dict(train=0, valid=len(pairs) + 7, test=len(pairs)))

    def lengths(split):
        with open(tmp_path / f"{split}.src") as s, open(tmp_path / f"{split}.tgt") as t:
            return [(len(a.split()), len(b.split())) for a, b in zip(s, t)]
    assert collections.Counter(lengths("test")) == collections.Counter(pairs)  # a whole pass: the file exactly
    valid = collections.Counter(lengths("valid"))
    assert sum(valid.values()) == len(pairs) + 7 and set(valid) <= set(pairs)


def test_words_pieces_parses_and_vocabulary(corpus):
    out, _ = corpus
    raw = os.path.join(out, "raw")
    with open(os.path.join(raw, "dict.txt")) as f:
        entries = [line.split() for line in f]
    assert len(entries) == 10000 - synthetic_corpus.N_SPECIALS
    assert len({e[0] for e in entries}) == len(entries)
    assert sum(e[0].endswith("@@") for e in entries) == len(entries) // synthetic_corpus.CONTINUATION_EVERY
    counts = [int(e[1]) for e in entries]
    assert counts == sorted(counts, reverse=True) and counts[0] > 0
    with open(os.path.join(raw, "train.src")) as f:
        lines = [line.split() for line in f]
    blocks = open(os.path.join(raw, "train.src.conllu")).read().strip().split("\n\n")
    assert len(blocks) == len(lines) == SIZES["train"]
    assert any(p.endswith("@@") for line in lines for p in line)
    for pieces, block in zip(lines, blocks):
        assert not pieces[-1].endswith("@@")  # a sentence ends with a whole word
        words = " ".join(pieces).replace("@@ ", "").split()
        rows = [r.split("\t") for r in block.splitlines() if not r.startswith("#")]
        assert [r[1] for r in rows] == words
        heads = [int(r[6]) for r in rows]
        assert heads.count(0) == 1 and all(0 <= h <= len(words) for h in heads)
        for w in range(1, len(words) + 1):  # every word reaches the root: a tree
            seen = set()
            while w:
                assert w not in seen
                seen.add(w)
                w = heads[w - 1]


def test_databin_loads_under_both_tasks_with_side_files(corpus):
    _, databin = corpus
    for split in ("train", "valid", "test"):
        for kind in ("wordids", "heads"):
            for ext in ("bin", "idx"):
                assert os.path.exists(os.path.join(databin, f"{split}.src-tgt.src.{kind}.{ext}"))
        for kind in ("wordids", "heads", "labels"):
            assert os.path.exists(os.path.join(databin, f"{split}.src.{kind}"))
    assert not os.path.exists(databin + ".side")
    langs = dict(source_lang="src", target_lang="tgt")
    task = dev.setup_task(databin, langs)
    assert len(task.source_dictionary) == 10000
    task.load_dataset("test")
    item = task.dataset("test")[0]
    assert len(item["src_word_ids"]) == len(item["source"]) and int(item["src_word_ids"].max()) == \
        len(item["src_word_heads"])
    plain = dev.setup_task(databin, langs, task="translation")
    plain.load_dataset("valid")
    assert len(plain.dataset("valid")) == SIZES["valid"]


@pytest.mark.parametrize("beam", [1, 5])
def test_min_len_equal_to_max_len_forces_the_length(beam):
    model, task = dev.build_model("transformer", TINY, vocab=60)
    sample = dev.random_sample(task, 3, 9, 9, seed=2)
    generator = bench_decode.generator_for(model.eval(), task, beam, 7)
    hypos = task.inference_step(generator, [model], sample)
    eos = task.target_dictionary.eos()
    for per_sentence in hypos:
        assert len(per_sentence) == beam
        for h in per_sentence:
            assert len(h["tokens"]) == 8 and int(h["tokens"][-1]) == eos and eos not in h["tokens"][:-1].tolist()


def test_launches_of_a_decoding_step_are_stable():
    model, task = dev.build_model("transformer", TINY, vocab=60)
    model.eval()
    sample = dev.random_sample(task, 4, 9, 9, seed=1)
    first = bench_decode.step_launches(model, task, sample, beam=3)
    later = bench_decode.step_launches(model, task, sample, beam=3, warm_steps=5)
    assert first["reorder"] > 0 and first["decoder"] > 0
    assert first["total"] == first["reorder"] + first["decoder"] == later["total"]
    assert (first["reorder"], first["decoder"]) == (later["reorder"], later["decoder"])
    whole = bench_decode.generate_launches(model, task, sample, beam=3, length=5)
    assert whole["encoder"] > 0 and whole["per_step"] > first["total"]  # the search's own ops on top
    assert whole == bench_decode.generate_launches(model, task, sample, beam=3, length=5)


def test_cached_generate_config_equals_a_fresh_one(corpus, tmp_path):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    _, databin = corpus
    configs = bench_decode.GenerateConfigs()
    configs(bench_decode.generate_argv(databin, "a.pt", 1, 12, False, max_tokens=1024))
    argv = bench_decode.generate_argv(databin, "b.pt", 5, 9, False, batch_size=1)
    _, cached = configs(argv)
    fresh = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_generation_parser(),
                                                                       input_args=argv))
    assert OmegaConf.to_container(cached) == OmegaConf.to_container(fresh)
    assert (cached.common_eval.path, cached.generation.beam, cached.dataset.batch_size) == ("b.pt", 5, 1)


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path):
    out = tmp_path / "decode.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "decode", "--quick",
                           "--archs", "umst,prime_simple", "--beams", "1,2", "--sentences", "10",
                           "--claim-sentences", "2", "--json", str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == ["transformer", "transformer_prime_shape", "umst", "prime_simple"]
    for r in rows.values():
        for beam in ("1", "2"):
            g = r["generate"][beam]
            assert g["sentences"] == 10 and g["ms_per_sentence"] > 0 and g["fairseq_sentences_per_s"] > 0
            assert r["vs"][beam]["transformer"] > 0
        assert r["launches"]["step"]["total"] > 0 and r["launches"]["generate"]["per_step"] > 0
    assert "shape" in rows["prime_simple"]["vs"]["1"] and "target_met" in rows["umst"]["vs"]["2"]
    assert rows["transformer"]["launches"]["step_vs_transformer"] == 1.0
    assert result["claim"]["sentences"] == 2 and result["claim"]["speedup"] > 0
    assert "| arch |" in proc.stdout and "Prime-simple's claim" in proc.stdout
