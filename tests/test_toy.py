"""The bundled toy corpus (umst_plugin/toy.py, README's first command trains on it) says what it is: its target is
the source translated by the rules of the module's docstring, read here off the gold dependency tree it writes (an
independent translator, not the generator), so a change to the grammar or to the trees fails here."""
import os
import random

import pytest

from umst_plugin import toy

NOUNS = {source: (target, gender) for source, target, gender in toy.NOUN_ROOTS}
ADJECTIVES, VERBS, DETERMINERS = dict(toy.ADJECTIVES), dict(toy.VERBS), dict(toy.DETERMINERS)


def _read_conllu(path):
    """[[(index, form, head, relation), ...] per sentence]."""
    sentences, rows = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                if rows:
                    sentences.append(rows)
                rows = []
            elif not line.startswith("#"):
                cols = line.split("\t")
                rows.append((int(cols[0]), cols[1], int(cols[6]), cols[7]))
    return sentences


def _noun(form):
    """(target roots in target order, gender, number) of a source noun: a root or two roots written as one word,
    plus the plural suffix."""
    number = "pl" if form.endswith(toy.PLURAL_SRC) else "sg"
    stem = form[:-len(toy.PLURAL_SRC)] if number == "pl" else form
    if stem in NOUNS:
        return [NOUNS[stem][0]], NOUNS[stem][1], number
    splits = [(stem[:i], stem[i:]) for i in range(1, len(stem)) if stem[:i] in NOUNS and stem[i:] in NOUNS]
    assert len(splits) == 1, f"{form!r} is not one noun or one compound of two"
    first, second = splits[0]
    return [NOUNS[second][0], NOUNS[first][0]], NOUNS[second][1], number  # the roots reversed, the gender the head's


def _translate(rows):
    """The target sentence by the docstring's rules, from the tree alone."""
    dependents = {}
    for index, form, head, rel in rows:
        dependents.setdefault(head, []).append((index, form, rel))
    forms = {index: form for index, form, _, _ in rows}

    def phrase(index):
        roots, gender, number = _noun(forms[index])
        agree = toy.AGREE[gender, number]
        words = roots[:-1] + [roots[-1] + agree + ("s" if number == "pl" else "")]
        kids = sorted(dependents.get(index, []))
        words += [ADJECTIVES[form] + agree for _, form, rel in kids if rel == "amod"]  # modifiers after the noun
        (det,) = [form for _, form, rel in kids if rel == "det"]
        words.append(DETERMINERS[det[:-len(toy.PLURAL_SRC)] if number == "pl" else det] + agree)
        for child, _, rel in kids:
            if rel == "nmod":  # X ko Y -> Y de X: the of-phrase first
                assert [f for _, f, r in dependents[child] if r == "case"] == [toy.OF_SRC]
                words = phrase(child) + [toy.OF_TGT] + words
        return words

    (root, verb, _), = [(i, f, r) for i, f, r in dependents[0]]
    (subject,) = [i for i, _, rel in dependents[root] if rel == "nsubj"]
    (obj,) = [i for i, _, rel in dependents[root] if rel == "obj"]
    _, gender, number = _noun(forms[subject])
    return phrase(subject) + phrase(obj) + [VERBS[verb] + toy.AGREE[gender, number]]  # SOV, the verb agrees


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("toy"))
    toy.main([out, "--seed", "3", "--train", "400", "--valid", "60", "--test", "60", "--bpe-merges", "0"])
    return out


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.split() for line in f]


@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_every_target_is_its_source_translated_by_the_documented_rules(corpus, split):
    sources = _lines(os.path.join(corpus, f"{split}.tok.kel"))
    targets = _lines(os.path.join(corpus, f"{split}.tok.mor"))
    trees = _read_conllu(os.path.join(corpus, f"{split}.kel.conllu"))
    assert len(sources) == len(targets) == len(trees) == {"train": 400, "valid": 60, "test": 60}[split]
    for source, target, rows in zip(sources, targets, trees):
        assert [form for _, form, _, _ in rows] == source
        assert [index for index, _, _, _ in rows] == list(range(1, len(source) + 1))
        assert sum(head == 0 for _, _, head, _ in rows) == 1 and all(0 <= h <= len(rows) for _, _, h, _ in rows)
        assert target == _translate(rows), " ".join(source)


def test_agreement_needs_the_tree_and_the_splits_are_disjoint(corpus):
    """The verb agrees with its subject even where an of-phrase puts a noun of another gender or number between
    them (the nearest noun is the wrong guess), compounds, plurals and of-phrases occur at the grammar's rates,
    and no valid or test source is a training source."""
    trees = _read_conllu(os.path.join(corpus, "train.kel.conllu"))
    nearest_wrong = compounds = plurals = of_phrases = 0
    for rows in trees:
        forms = {i: f for i, f, _, _ in rows}
        relation = {i: r for i, _, _, r in rows}
        # an of-phrase hangs off a subject or an object, never off another of-phrase (depth 1 at most)
        assert all(relation[h] in ("nsubj", "obj") for _, _, h, r in rows if r == "nmod")
        of_phrases += sum(r == "nmod" for _, _, _, r in rows)
        root = next(i for i, _, h, _ in rows if h == 0)
        subject = next(i for i, _, h, r in rows if h == root and r == "nsubj")
        nouns_before_verb = [i for i, _, _, r in rows if r in ("nsubj", "nmod") and i < root]
        nearest = max(nouns_before_verb)
        nearest_wrong += _noun(forms[nearest])[1:] != _noun(forms[subject])[1:]
        compounds += sum(len(_noun(forms[i])[0]) == 2 for i, _, _, r in rows if r in ("nsubj", "obj", "nmod"))
        plurals += sum(_noun(forms[i])[2] == "pl" for i, _, _, r in rows if r in ("nsubj", "obj", "nmod"))
    # seed 3 gives 114, 515 and 410 in 400 sentences (2 noun phrases each, an of-phrase in 40%); half of each is
    # the floor: the rates of the docstring's grammar, not the draws of one seed
    assert nearest_wrong >= 57 and compounds >= 257 and plurals >= 205, (nearest_wrong, compounds, plurals)
    assert 0.3 * 800 <= of_phrases <= 0.5 * 800, of_phrases  # 40% of the 800 subjects and objects
    train = {" ".join(s) for s in _lines(os.path.join(corpus, "train.tok.kel"))}
    for split in ("valid", "test"):
        held_out = [" ".join(s) for s in _lines(os.path.join(corpus, f"{split}.tok.kel"))]
        assert not train & set(held_out) and len(set(held_out)) == len(held_out)


def test_the_same_seed_writes_the_same_corpus_and_another_seed_another(tmp_path, corpus):
    toy.write_toy_corpus(str(tmp_path / "again"), seed=3, n_train=400, n_valid=60, n_test=60)
    toy.write_toy_corpus(str(tmp_path / "other"), seed=4, n_train=400, n_valid=60, n_test=60)
    for name in ("train.tok.kel", "test.tok.mor", "valid.kel.conllu"):
        with open(os.path.join(corpus, name), encoding="utf-8") as f:
            first = f.read()
        assert (tmp_path / "again" / name).read_text(encoding="utf-8") == first
        assert (tmp_path / "other" / name).read_text(encoding="utf-8") != first
    assert not os.path.exists(os.path.join(corpus, "bpe.codes")) and not os.path.exists(os.path.join(corpus, "train.kel"))


def test_bpe_keeps_compounds_and_plurals_in_pieces(tmp_path):
    """The joint BPE (few merges, on purpose) writes every split for both languages, undoes to the tokenized text,
    and leaves words of several pieces, which is what gives the word scale work."""
    out = str(tmp_path)
    toy.write_toy_corpus(out, seed=1, n_train=300, n_valid=20, n_test=20)
    toy.bpe_toy_corpus(out, merges=100)
    pieces = 0
    for split in ("train", "valid", "test"):
        for lang in (toy.SRC, toy.TGT):
            bpe = (tmp_path / f"{split}.{lang}").read_text(encoding="utf-8")
            assert bpe.replace("@@ ", "") == (tmp_path / f"{split}.tok.{lang}").read_text(encoding="utf-8")
            pieces += bpe.count("@@ ")
    assert pieces > 1000


def test_make_sentence_draws_from_the_generator_it_is_given():
    assert toy.make_sentence(random.Random(7)) == toy.make_sentence(random.Random(7))
