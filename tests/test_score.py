"""umst_tools/score.py (scripts/score.py, evaluate.sh's scorer) on fairseq-generate output written here: which lines
it reads, the errors for output and references that do not match, and what ``--json``, ``--extra``,
``--test-set`` and ``--detok-out`` write. The BLEU formulas themselves: tests/test_recipes.py's tokenized-BLEU
tests."""
import json

import pytest
import sacrebleu

from umst_tools import score

HYPS = ["die Gesundheits-Reform ist da .", "das Haus ist &quot; gro\u00df &quot; .", "ein Test"]
REFS = ["die Gesundheits-Reform ist da .", "das Haus ist &quot; klein &quot; .", "ein kleiner Test"]


def _generate(path, hyps, refs, order=None):
    """fairseq-generate's lines for each sentence (S-, T-, H- with its score, D-, P-), sentences in ``order``."""
    lines = ["2026-12-05 | INFO | fairseq_cli.generate | loading model(s)\n"]
    for i in order or range(len(hyps)):
        lines += [f"S-{i}\tsource {i}\n", f"T-{i}\t{refs[i]}\n", f"H-{i}\t-0.{i + 1}\t{hyps[i]}\n",
                  f"D-{i}\t-0.{i + 1}\t{hyps[i]}\n", f"P-{i}\t-0.1 -0.2\n"]
    lines.append("Generate test with beam=4: BLEU4 = 1.00\n")
    path.write_text("".join(lines), encoding="utf-8")
    return str(path)


def _lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_read_generate_takes_h_and_t_lines_in_sentence_order(tmp_path):
    gen = _generate(tmp_path / "gen.out", HYPS, REFS, order=[2, 0, 1])
    assert score.read_generate(gen) == (HYPS, REFS)


def test_read_generate_names_the_file_when_a_sentence_is_missing(tmp_path):
    gen = _generate(tmp_path / "gen.out", HYPS, REFS, order=[0, 2])
    with pytest.raises(SystemExit, match=r"gen\.out: hypotheses for 2 sentences but ids are not 0\.\.1"):
        score.read_generate(gen)


def test_references_of_another_length_are_refused_naming_the_file(tmp_path):
    gen = _generate(tmp_path / "gen.out", HYPS, REFS)
    short = _lines(tmp_path / "ref.tok", REFS[:2])
    with pytest.raises(SystemExit, match=r"3 hypotheses but 2 tokenized references \(.*ref\.tok\)"):
        score.score(gen, "de", tok_ref=short)
    with pytest.raises(SystemExit, match=r"3 hypotheses but 2 detokenized references \(.*ref\.detok\)"):
        score.score(gen, "de", detok_ref=_lines(tmp_path / "ref.detok", REFS[:2]))


def test_scores_are_sacrebleus_on_the_lines_it_was_given(tmp_path):
    """Without --tok-ref the T- lines are the reference; no compound splitting unless asked; sacreBLEU on the
    detokenized hypotheses against the untokenized reference, with its signature."""
    gen = _generate(tmp_path / "gen.out", HYPS, REFS)
    result, detok = score.score(gen, "de")
    plain = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(HYPS, [REFS])
    assert result["tok_bleu"] == round(plain.score, 2) and result["compound_split"] is False
    assert result["tok_bleu_detail"] == str(plain) and "sacrebleu" not in result
    assert detok == ['die Gesundheits-Reform ist da.', 'das Haus ist "gro\u00df".', "ein Test"]

    split = score.score(gen, "de", compound=True)[0]
    assert split["compound_split"] is True and split["tok_bleu"] == round(score.tokenized_bleu(HYPS, REFS, True).score, 2)
    assert split["tok_bleu"] != result["tok_bleu"]

    detok_refs = ['die Gesundheits-Reform ist da.', 'das Haus ist "klein".', "ein kleiner Test"]
    full = score.score(gen, "de", tok_ref=_lines(tmp_path / "ref.tok", REFS),
                       detok_ref=_lines(tmp_path / "ref.detok", detok_refs))[0]
    expected = sacrebleu.metrics.BLEU().corpus_score(detok, [detok_refs])
    assert full["sacrebleu"] == round(expected.score, 2) and full["sacrebleu_detail"] == str(expected)
    assert full["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")


def test_tokenized_input_raises_no_detokenize_warning(tmp_path, caplog):
    """Tokenized BLEU scores tokenized text on purpose: sacreBLEU's "forgot to detokenize" warning (100 lines
    ending in " .") would be wrong here."""
    lines = [f"satz nummer {i} ." for i in range(120)]
    with caplog.at_level("WARNING"):
        assert score.tokenized_bleu(lines, lines).score == pytest.approx(100.0)
    assert not [r for r in caplog.records if "detokenize" in r.getMessage()]


def test_main_merges_into_the_json_and_writes_what_it_is_asked(tmp_path, capsys):
    gen = _generate(tmp_path / "gen.out", HYPS, REFS)
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"row": "old", "kept": 1}))
    detok_out = tmp_path / "hyp.detok"
    assert score.main(["--generate", gen, "--lang", "de", "--compound-split", "--json", str(out),
                       "--detok-ref", _lines(tmp_path / "ref.detok", REFS), "--detok-out", str(detok_out),
                       "--extra", "row=umst-t2-transformer-base", "--extra", "note=a=b",
                       "--test-set", "newstest2014 (3,003 sentences)"]) == 0
    written = json.loads(out.read_text())
    assert written["kept"] == 1 and written["row"] == "umst-t2-transformer-base" and written["note"] == "a=b"
    assert written["test_set"] == "newstest2014 (3,003 sentences)" and written["compound_split"] is True
    assert written["sentences"] == 3 and "sacrebleu" in written and not (tmp_path / "results.json.tmp").exists()
    assert detok_out.read_text(encoding="utf-8").splitlines() == score.score(gen, "de")[1]
    printed = capsys.readouterr().out
    assert "tokenized BLEU (compound split): BLEU = " in printed
    assert "signature: nrefs:1" in printed and printed.rstrip().endswith("on newstest2014 (3,003 sentences)")


@pytest.mark.parametrize("missing", ["--generate", "--lang"])
def test_main_requires_the_output_and_the_language(tmp_path, missing, capsys):
    args = {"--generate": _generate(tmp_path / "gen.out", HYPS, REFS), "--lang": "de"}
    del args[missing]
    with pytest.raises(SystemExit) as stop:
        score.main([x for item in args.items() for x in item])
    assert stop.value.code == 2 and f"the following arguments are required: {missing}" in capsys.readouterr().err
