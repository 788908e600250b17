"""Side data follows fairseq's batches: left/right padding, length re-sorting, truncation, data shards,
and the interactive path that derives word ids from tokens."""
import os
import shutil

import pytest
import torch

import e2e
from umst_dev import dev
from umst_plugin.data.word_boundaries import (SENTENCEPIECE, SUBWORD_NMT, boundary_table, word_ids_from_pieces,
                                              word_ids_from_tokens, words_from_pieces)


def read_rows(path):
    with open(path, encoding="utf-8") as f:
        return [[int(x) for x in line.split()] for line in f]


def expected_rows(databin, split):
    return read_rows(os.path.join(databin, f"{split}.{e2e.SRC}.wordids")), \
        read_rows(os.path.join(databin, f"{split}.{e2e.SRC}.heads"))


def task_on(databin, **overrides):
    return dev.setup_task(databin, {"source_lang": e2e.SRC, "target_lang": e2e.TGT, **overrides})


def check_batches(task, split, word_rows, head_rows, left_pad, max_len=None):
    """Every row of every real batch carries exactly its own sentence's side data."""
    dataset = task.dataset(split)
    itr = task.get_batch_iterator(dataset, max_tokens=200, seed=1).next_epoch_itr(shuffle=True)
    pad = task.source_dictionary.pad()
    seen = 0
    for batch in itr:
        net = batch["net_input"]
        assert net["src_word_ids"].shape == net["src_tokens"].shape
        assert net["src_word_ids"].eq(0).equal(net["src_tokens"].eq(pad))  # same padding layout
        for b, sent_id in enumerate(batch["id"].tolist()):
            words = word_rows[sent_id][: (max_len - 1) if max_len else None]
            n_words = words[-1]
            want_ids = torch.tensor(words + [n_words + 1])
            heads = [h if h <= n_words else 0 for h in head_rows[sent_id][:n_words]] + [0]
            row = net["src_word_ids"][b]
            got_ids = row[row.ne(0)]
            assert got_ids.tolist() == want_ids.tolist(), f"sentence {sent_id}"
            real = row.ne(0).nonzero().squeeze(1)
            if left_pad:
                assert real[-1] == row.numel() - 1
            else:
                assert real[0] == 0
            head_row = net["src_word_heads"][b]
            assert head_row[: len(heads)].tolist() == heads, f"sentence {sent_id}"
            assert head_row[len(heads):].eq(-1).all()
            seen += 1
    assert seen == len(dataset)


@pytest.mark.parametrize("left_pad", [True, False], ids=["left-pad", "right-pad"])
def test_side_data_aligned_in_real_batches(toy_databin, left_pad):
    # fairseq's --left-pad-source is a store_false switch: giving the flag means right padding
    task = task_on(toy_databin, left_pad_source=not left_pad)
    assert task.cfg.left_pad_source == left_pad
    task.load_dataset("train")
    check_batches(task, "train", *expected_rows(toy_databin, "train"), left_pad=left_pad)


def test_truncation_truncates_side_data(toy_databin):
    task = task_on(toy_databin, truncate_source=True, max_source_positions=6)
    task.load_dataset("valid")
    word_rows, head_rows = expected_rows(toy_databin, "valid")
    assert max(len(r) for r in word_rows) > 6  # the cut really happens
    check_batches(task, "valid", word_rows, head_rows, left_pad=True, max_len=6)


def test_data_shards_round_robin(toy_raw, toy_databin, tmp_path):
    """fairseq reads shard (epoch - 1) mod n of ``data1:data2:...``; the side files come from the same shard.
    Three shards of three sizes: with two, epoch - 1 and epoch + 1 name the same shard."""
    shards = [toy_databin]
    for n_train, seed in ((120, 7), (90, 8)):
        raw = e2e.make_toy_corpus(str(tmp_path / f"raw_{seed}"), n_train=n_train, n_valid=10, n_test=10, seed=seed)
        shards.append(e2e.binarize(raw, str(tmp_path / f"bin_{seed}"), splits=("train",), dicts_from=toy_databin))
    task = task_on(":".join(shards))
    for epoch, shard, size in ((2, shards[1], 120), (3, shards[2], 90)):
        task.load_dataset("train", epoch=epoch)
        assert len(task.dataset("train")) == size
        check_batches(task, "train", *expected_rows(shard, "train"), left_pad=True)


def copy_split(databin, from_split, to_split):
    """Every file of a split (both languages' tokens, the side files and their text) copied as another split."""
    for name in os.listdir(databin):
        if name.startswith(f"{from_split}."):
            shutil.copy(os.path.join(databin, name), os.path.join(databin, to_split + name[len(from_split):]))


def test_shards_within_a_data_dir_combine_for_training_only(toy_databin, tmp_path):
    """``train`` + ``train1`` in one data dir (fairseq's way to add data, e.g. back-translations, with
    ``--upsample-primary``): training concatenates both, the primary ``train`` repeated, and the side data follows;
    ``valid`` loads alone beside a ``valid1`` (fairseq-train passes combine=False, fairseq-generate the default)."""
    databin = str(tmp_path / "data-bin")
    shutil.copytree(toy_databin, databin)
    copy_split(databin, "valid", "train1")
    copy_split(databin, "train", "valid1")
    task = task_on(databin, upsample_primary=2)
    task.load_dataset("train", combine=True)
    train_words, train_heads = expected_rows(databin, "train")
    extra_words, extra_heads = expected_rows(databin, "train1")
    assert len(task.dataset("train")) == 2 * len(train_words) + len(extra_words)
    # fairseq's ConcatDataset maps the primary's repeats back to its rows (index mod its size)
    check_batches(task, "train", 2 * train_words + extra_words, 2 * train_heads + extra_heads, left_pad=True)
    task.load_dataset("valid")  # as fairseq-generate loads its split: combine left at its default
    valid_words, valid_heads = expected_rows(databin, "valid")
    assert len(task.dataset("valid")) == len(valid_words) != len(expected_rows(databin, "valid1")[0])
    check_batches(task, "valid", valid_words, valid_heads, left_pad=True)


def test_every_sentence_outside_training_is_batched(toy_databin):
    """fairseq-fixed drops a last batch that is not a multiple of --required-batch-size-multiple (fairseq-train's
    8); the task keeps it outside training, so validation and decoding see every sentence, and training's batches
    stay multiples of 8 (but the last)."""
    task = task_on(toy_databin)
    task.load_dataset("train")
    task.load_dataset("valid")
    for split in ("train", "valid"):
        dataset = task.dataset(split)
        itr = task.get_batch_iterator(dataset, max_tokens=200, seed=1, required_batch_size_multiple=8)
        sizes = [len(batch["id"]) for batch in itr.next_epoch_itr(shuffle=False)]
        if split == "valid":
            assert len(dataset) % 8 != 0 and sum(sizes) == len(dataset), sizes
        else:
            assert all(size % 8 == 0 for size in sizes[:-1]) and sum(sizes) == len(dataset), sizes
    # the same by position, as fairseq's own callers pass it (dataset, max_tokens, max_sentences, max_positions,
    # ignore_invalid_inputs, required_batch_size_multiple)
    itr = task.get_batch_iterator(task.dataset("valid"), 200, None, None, False, 8)
    assert sum(len(batch["id"]) for batch in itr.next_epoch_itr(shuffle=False)) == len(task.dataset("valid"))


def test_raw_input_notes_its_preparation_once(toy_databin, tmp_path, caplog):
    """Where raw text is about to be prepared, the task says once how: by the data-bin's record, by the arguments
    alone (--text-preprocessing arguments), or that the data-bin has no record."""
    import logging

    from umst_plugin import text_preprocessing as textprep

    with_record = str(tmp_path / "with-record")
    shutil.copytree(toy_databin, with_record)
    with open(os.path.join(with_record, "bpe.codes"), "w") as f:
        f.write("#version: 0.2\n")
    textprep.write_record(with_record, [e2e.SRC, e2e.TGT], lowercase=True, bpe_codes="bpe.codes")
    cases = [(with_record, {}, f"{with_record}/{textprep.RECORD_NAME}: raw {e2e.SRC} input gets"),
             (with_record, {"text_preprocessing": "arguments"}, "--text-preprocessing arguments: raw input is "
                                                                "prepared only by --tokenizer/--bpe as given"),
             (toy_databin, {}, f"{toy_databin} has no {textprep.RECORD_NAME}")]
    for databin, overrides, message in cases:
        task = task_on(databin, **overrides)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            for _ in range(3):
                task.note_raw_input()
        notes = [r.getMessage() for r in caplog.records if r.name.startswith("umst_plugin")]
        assert len(notes) == 1 and notes[0].startswith(message), (message, notes)


def test_interactive_word_ids_match_preprocessed(toy_databin):
    """Word ids derived from tokens (fairseq-interactive) == those umst-preprocess wrote."""
    task = task_on(toy_databin)
    task.load_dataset("valid")
    stored = task.dataset("valid")
    tokens = [stored.dataset.src[i] for i in range(len(stored))]
    derived = task.build_dataset_for_inference(tokens, [len(t) for t in tokens])
    for i in range(len(stored)):
        assert derived[i]["src_word_ids"].tolist() == stored[i]["src_word_ids"].tolist()
        assert derived[i]["src_word_heads"].eq(0).all()  # fallback graph without a parser
    # fairseq-interactive keeps only src_tokens/src_lengths: inference_step rebuilds the side inputs
    batch = stored.collater([stored[i] for i in range(8)])
    model, _ = dev.build_model("umst_base", {"encoder_layers": 1, "decoder_layers": 1, "encoder_embed_dim": 8,
                                             "decoder_embed_dim": 8, "encoder_ffn_embed_dim": 8,
                                             "decoder_ffn_embed_dim": 8, "encoder_attention_heads": 2,
                                             "decoder_attention_heads": 2})
    # a batch that carries its side inputs (fairseq-generate on a data-bin) keeps them: the parsed heads
    assert task._add_missing_side_inputs(batch, [model]) is batch
    assert batch["net_input"]["src_word_heads"].gt(0).any()
    bare = {"net_input": {k: batch["net_input"][k] for k in ("src_tokens", "src_lengths")}}
    rebuilt = task._add_missing_side_inputs(bare, [model])["net_input"]
    assert rebuilt["src_word_ids"].equal(batch["net_input"]["src_word_ids"])
    assert rebuilt["src_word_heads"].equal(batch["net_input"]["src_word_heads"].clamp(max=0))


def test_the_collater_hands_transformer_sf_its_character_length(toy_databin):
    """A model that asks for host-side batch hints (``host_batch_hint``: TranSFormer's longest character sequence,
    which its encoder would otherwise read off the device, a host sync per batch) gets them in every batch the
    task's datasets collate, equal to what the encoder would have read."""
    from fairseq import tasks

    cfg = dev.config_of(dev.parse_args("transformer_sf_base", {"encoder_layers": 1, "decoder_layers": 1,
                                                               "source_lang": e2e.SRC, "target_lang": e2e.TGT},
                                       "multiscale_translation", toy_databin))
    task = tasks.setup_task(cfg.task)
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    assert "src_char_len" not in dataset.collater([dataset[i] for i in range(4)])["net_input"]  # no model yet
    model = task.build_model(cfg.model)
    batch = dataset.collater([dataset[i] for i in range(8)])
    src_tokens = batch["net_input"]["src_tokens"]
    assert batch["net_input"]["src_char_len"] == model.encoder.char_table.max_char_length(src_tokens) > 0


SP = "\u2581"


@pytest.mark.parametrize("pieces,scheme,ids,words", [
    ("the new@@ est car".split(), SUBWORD_NMT, [1, 2, 2, 3], ["the", "newest", "car"]),
    ("a@@ b@@ c d".split(), SUBWORD_NMT, [1, 1, 1, 2], ["abc", "d"]),
    (f"{SP}the {SP}new est {SP}car".split(), SENTENCEPIECE, [1, 2, 2, 3], ["the", "newest", "car"]),
    (f"est {SP}car".split(), SENTENCEPIECE, [1, 2], ["est", "car"]),  # first piece always starts a word
    (f"{SP}Grü ße {SP}ö".split(), SENTENCEPIECE, [1, 1, 2], ["Grüße", "ö"]),
])
def test_word_ids_from_pieces(pieces, scheme, ids, words):
    assert word_ids_from_pieces(pieces, scheme) == ids
    assert words_from_pieces(pieces, scheme) == words


@pytest.mark.parametrize("scheme,first,other", [(SUBWORD_NMT, "un@@", "do"), (SENTENCEPIECE, "est", f"{SP}car")])
def test_the_first_symbol_after_the_special_ones_is_read_like_any_other(scheme, first, other):
    """Only the special symbols (pad, eos, bos, unk) begin a word whatever they are; the dictionary's next entry,
    its most frequent piece, continues or not by its own marker."""
    from fairseq.data import Dictionary

    d = Dictionary()
    for sym in (first, other):
        d.add_symbol(sym)
    assert d.index(first) == d.nspecial
    _, continues, begins = boundary_table(d, scheme)
    assert continues[: d.nspecial].tolist() == [False] * d.nspecial and begins[: d.nspecial].all()
    if scheme == SUBWORD_NMT:
        assert continues[d.index(first)] and not continues[d.index(other)]
    else:
        assert not begins[d.index(first)] and begins[d.index(other)]


@pytest.mark.parametrize("scheme", [SUBWORD_NMT, SENTENCEPIECE])
@pytest.mark.parametrize("left_pad", [True, False])
def test_word_ids_from_token_tensor_match_text_rule(scheme, left_pad):
    from fairseq.data import Dictionary, data_utils

    d = Dictionary()
    if scheme == SUBWORD_NMT:
        vocab = ["the", "new@@", "est", "car", "a@@", "b"]
    else:
        vocab = [f"{SP}the", f"{SP}new", "est", f"{SP}car", "x", f"{SP}b"]
    for sym in vocab:
        d.add_symbol(sym)
    # the last: a row cut after a piece that continues (a source cut mid-word): </s> is still a word of its own
    sentences = [[1, 2, 3], [0, 4, 5, 1, 2], [3], [2, 0], [0, 1]]
    scheme_found, continues, begins = boundary_table(d)
    assert scheme_found == scheme
    rows = [torch.tensor([d.index(vocab[i]) for i in s] + [d.eos()]) for s in sentences]
    batch = data_utils.collate_tokens(rows, d.pad(), left_pad=left_pad)
    got = word_ids_from_tokens(batch, d.pad(), d.eos(), continues, begins, scheme)
    for b, s in enumerate(sentences):
        want = word_ids_from_pieces([vocab[i] for i in s], scheme)
        want = want + [want[-1] + 1]
        row = got[b]
        assert row[row.ne(0)].tolist() == want


@pytest.mark.parametrize("symbols,scheme", [
    # the minority's marker first: the dictionary's first entry, the first line of the BPE text below
    ([f"{SP}x", "the", "new@@", "est", "car", "a@@", "b"], SUBWORD_NMT),  # a stray ▁ in subword-nmt
    (["ab@@", f"{SP}the", f"{SP}new", "est", f"{SP}car", "x"], SENTENCEPIECE),  # a piece ending in @@ in sentencepiece
    (["the", "car", "@@", "x"], SUBWORD_NMT),  # no marker (a bare @@ is not counted): every piece a word
], ids=["subword-nmt", "sentencepiece", "no-marker"])
def test_the_task_the_char_table_and_preprocessing_read_one_scheme_by_the_markers_count(symbols, scheme, tmp_path):
    """The task's word boundaries, TranSFormer's character table and umst-preprocess's ``--bpe auto`` take the
    scheme that most marked pieces show, not the first ``▁`` or the first line, and give the same word ids."""
    from fairseq.data import Dictionary, data_utils

    from umst_plugin.modules.transformer_sf.char_table import CharTable
    from umst_plugin.preprocess.cli import sniff_scheme

    d = Dictionary()
    for sym in symbols:
        d.add_symbol(sym)
    found, continues, begins = boundary_table(d)
    assert found == scheme
    table = CharTable.from_dictionary(d)
    assert table.style == scheme
    sentences = [list(range(len(symbols))), list(reversed(range(len(symbols)))), [len(symbols) - 1, 0]]
    rows = [torch.tensor([d.index(symbols[i]) for i in s] + [d.eos()]) for s in sentences]
    batch = data_utils.collate_tokens(rows, d.pad(), left_pad=True)
    task_ids = word_ids_from_tokens(batch, d.pad(), d.eos(), continues, begins, scheme)
    assert torch.equal(table(batch).token_word_ids, task_ids)
    # a BPE text whose first line holds only the minority's marker: the first 1,000 lines decide
    text = tmp_path / "train.en"
    text.write_text("\n".join([f"{symbols[0]} y"] + [" ".join(symbols)] * 3) + "\n", encoding="utf-8")
    assert sniff_scheme(str(text)) == scheme


# ---- the numpy item and collate against the torch ones they replaced (bcc7a7e's, kept here as the reference) ----

def _reference_item(side, index):
    """SideDataLanguagePairDataset.__getitem__ as it was in torch, one tensor op per step."""
    item = side.dataset[index]
    source = item["source"]
    padding = 0
    if side.dataset.buckets:  # the pad tokens fairseq's bucketing put at the end its batches pad
        tokens = source.tolist() if side.dataset.left_pad_source else source.tolist()[::-1]
        padding = next((k for k, token in enumerate(tokens) if token != side.pad), len(tokens))
    if padding:
        source = source[padding:] if side.dataset.left_pad_source else source[:len(source) - padding]
    has_eos = bool(len(source)) and int(source[-1]) == side.eos
    n_tok = len(source) - int(has_eos)
    if side.word_ids is not None:
        word_ids = side.word_ids[index][:n_tok].long()
    else:
        scheme, continues, begins = side.boundaries
        word_ids = word_ids_from_tokens(source[None, :n_tok], side.pad, side.eos, continues, begins, scheme)[0]
    n_words = int(word_ids[-1]) if n_tok else 0
    if side.heads is None:
        heads = torch.zeros(n_words, dtype=torch.long)
    else:
        heads = side.heads[index][:n_words].long()
        heads = heads.masked_fill(heads > n_words, 0)
    if has_eos:
        word_ids = torch.cat([word_ids, word_ids.new_tensor([n_words + 1])])
        heads = torch.cat([heads, heads.new_zeros(1)])
    if padding:
        pad = word_ids.new_zeros(padding)
        word_ids = torch.cat([pad, word_ids] if side.dataset.left_pad_source else [word_ids, pad])
    return word_ids, heads


def _same_tensor(got, want):
    return got.dtype == want.dtype == torch.int64 and got.shape == want.shape and got.equal(want)


@pytest.mark.parametrize("overrides", [{}, {"left_pad_source": False}, {"truncate_source": True,
                                                                        "max_source_positions": 6},
                                       {"num_batch_buckets": 3}, {"num_batch_buckets": 3, "left_pad_source": False}],
                         ids=["left-pad", "right-pad", "truncated", "buckets", "buckets-right-pad"])
def test_numpy_items_and_batches_equal_the_torch_reference(toy_databin, overrides):
    """Every item's word ids and heads, and every batch's, equal what the torch implementation built (a data loader
    worker builds ~800 items per batch at the recipe's batch: the numpy path is the fast one, this its check), for
    stored side files under left and right padding, truncation and bucketing, and for word ids derived from the
    tokens with the fallback graph (raw-text inference)."""
    from fairseq.data import data_utils

    from umst_plugin.data.side_data_dataset import SideDataLanguagePairDataset
    from umst_plugin.patches import original

    fairseqs_collate_tokens = original(data_utils.collate_tokens)  # fairseq's own, row by row
    task = task_on(toy_databin, **overrides)
    task.load_dataset("train")
    stored = task.dataset("train")
    derived = SideDataLanguagePairDataset(stored.dataset, word_ids=None, heads=None, boundaries=task.boundaries)
    headless = SideDataLanguagePairDataset(stored.dataset, word_ids=stored.word_ids, heads=None)
    generator = torch.Generator().manual_seed(0)
    for side in (stored, derived, headless):
        for index in range(len(side)):
            item = side[index]
            want_ids, want_heads = _reference_item(side, index)
            assert _same_tensor(item["src_word_ids"], want_ids), (index, item["src_word_ids"], want_ids)
            assert _same_tensor(item["src_word_heads"], want_heads), (index, item["src_word_heads"], want_heads)
        # a batch's items at once (what the data loader asks for): the same items as one by one, in any order,
        # an index twice, one sentence alone
        shuffled = torch.randperm(len(side), generator=generator).tolist()
        for indices in (shuffled, shuffled[:7] + shuffled[:2], shuffled[:1], list(range(len(side)))):
            many = side.__getitems__(indices)
            assert len(many) == len(indices)
            for index, item in zip(indices, many):
                one = side[index]
                assert sorted(item) == sorted(one) and item["id"] == index
                for key in ("source", "target", "src_word_ids", "src_word_heads"):
                    assert item[key].dtype == one[key].dtype and item[key].equal(one[key]), (index, key)
        itr = task.get_batch_iterator(side, max_tokens=200, seed=1).next_epoch_itr(shuffle=True)
        for batch in itr:
            net = batch["net_input"]
            ordered = [side[int(i)] for i in batch["id"]]
            want_ids = fairseqs_collate_tokens([s["src_word_ids"] for s in ordered], pad_idx=0,
                                               left_pad=side.dataset.left_pad_source,
                                               pad_to_length=net["src_tokens"].size(1))
            want_heads = fairseqs_collate_tokens([s["src_word_heads"] for s in ordered], pad_idx=-1, left_pad=False)
            assert _same_tensor(net["src_word_ids"], want_ids) and _same_tensor(net["src_word_heads"], want_heads)


def test_item_arrays_read_the_side_files_items_as_fairseq_does(toy_databin):
    """side_files.ItemArrays: each item of an mmap side file as a view of its flat array equals fairseq's own
    MMapIndexedDataset item; a pickled copy (a spawned loader worker's) builds its views again; any other
    indexable is read through its __getitem__."""
    import pickle

    import numpy as np

    from umst_plugin.data.side_files import HEADS, WORD_IDS, ItemArrays, load_side

    for kind in (WORD_IDS, HEADS):
        dataset = load_side(os.path.join(toy_databin, f"train.{e2e.SRC}-{e2e.TGT}.{e2e.SRC}"), kind)
        rows = ItemArrays(dataset)
        copy = pickle.loads(pickle.dumps(rows))
        assert len(rows) == len(dataset) > 1
        for i in range(len(dataset)):
            want = dataset[i].numpy()
            assert np.array_equal(rows[i], want) and np.array_equal(copy[i], want), (kind, i)
        assert rows._flat is not None and copy._flat is not None  # built once, in each process
        assert pickle.loads(pickle.dumps(rows))._flat is None  # not sent along: rebuilt where read
    listed = ItemArrays([torch.tensor([3, 1]), torch.tensor([0])])
    assert listed[0].tolist() == [3, 1] and listed[1].tolist() == [0] and len(listed) == 2
    # a batch's prefixes in one gather: the same values as a slice per item, for mmap files and other indexables
    generator = np.random.default_rng(0)
    for rows in (ItemArrays(dataset), ItemArrays([dataset[i] for i in range(len(dataset))])):
        indices = generator.permutation(len(dataset))[:40].tolist() + [0, 0]
        limits = generator.integers(0, 12, len(indices))
        flat, counts = rows.prefixes(indices, limits)
        want = [dataset[i].numpy()[:n] for i, n in zip(indices, limits)]
        assert flat.dtype == np.int64 and counts.tolist() == [len(w) for w in want]
        assert np.array_equal(flat, np.concatenate(want)) and 0 < counts.sum() < sum(len(dataset[i]) for i in indices)
    assert listed.prefixes([], [])[0].shape == (0,) and ItemArrays(dataset).prefixes([], [])[0].shape == (0,)


def test_the_data_loader_builds_each_batchs_items_at_once(toy_databin, monkeypatch):
    """fairseq's epoch iterator (torch's DataLoader) asks the side data for a batch's items in one call
    (``__getitems__``), and its batches carry each sentence's own side data."""
    from umst_plugin.data.side_data_dataset import SideDataLanguagePairDataset

    calls = []
    batch_items = SideDataLanguagePairDataset.__getitems__

    def counted(self, indices):
        calls.append(len(indices))
        return batch_items(self, indices)

    monkeypatch.setattr(SideDataLanguagePairDataset, "__getitems__", counted)
    task = task_on(toy_databin)
    task.load_dataset("train")
    batches = list(task.get_batch_iterator(task.dataset("train"), max_tokens=200, seed=1).next_epoch_itr(shuffle=True))
    assert calls == [len(b["id"]) for b in batches] and len(batches) > 3
    check_batches(task, "train", *expected_rows(toy_databin, "train"), left_pad=True)


class _EveryOtherSourceWithoutEos:
    """A source dataset whose odd items lack their end-of-sentence (as raw text or a source fairseq stripped gives)."""

    def __init__(self, dataset, eos):
        self.dataset, self.eos, self.sizes = dataset, eos, dataset.sizes

    def __getitem__(self, index):
        item = self.dataset[index]
        if index == 1:
            return item[:0]  # no token at all
        return item[:-1] if index % 2 and int(item[-1]) == self.eos else item

    def __len__(self):
        return len(self.dataset)


def test_batch_items_of_sources_with_and_without_eos(toy_databin):
    """A batch mixing sources with and without the end-of-sentence, and an empty one: built at once and one by one,
    each item's word ids and heads are the reference's (the </s> word only where there is an </s>)."""
    from fairseq.data import LanguagePairDataset

    from umst_plugin.data.side_data_dataset import SideDataLanguagePairDataset

    task = task_on(toy_databin)
    task.load_dataset("train")
    stored = task.dataset("train")
    pairs = stored.dataset
    mixed = LanguagePairDataset(_EveryOtherSourceWithoutEos(pairs.src, pairs.eos), pairs.src_sizes, pairs.src_dict,
                                pairs.tgt, pairs.tgt_sizes, pairs.tgt_dict)
    side = SideDataLanguagePairDataset(mixed, word_ids=stored.word_ids, heads=stored.heads)
    indices = list(range(len(side)))[::-1]
    many = side.__getitems__(indices)
    assert sum(len(item["source"]) > 0 and int(item["source"][-1]) != side.eos for item in many) > 10
    assert len(many[-2]["source"]) == 0 and len(many[-2]["src_word_ids"]) == 0  # index 1
    for index, item in zip(indices, many):
        want_ids, want_heads = _reference_item(side, index)
        for got in (item, side[index]):
            assert _same_tensor(got["src_word_ids"], want_ids), (index, got["src_word_ids"], want_ids)
            assert _same_tensor(got["src_word_heads"], want_heads), (index, got["src_word_heads"], want_heads)


def test_the_wrapper_reads_as_the_pair_dataset_it_wraps(toy_databin):
    """fairseq's CLIs read LanguagePairDataset attributes off task.dataset(split): the wrapper hands them on, and
    pickles (a spawned data loader worker gets a copy) without recursing for its own missing attributes."""
    import pickle

    task = task_on(toy_databin)
    task.load_dataset("train")
    side = task.dataset("train")
    assert side.src_dict is side.dataset.src_dict and side.left_pad_source == side.dataset.left_pad_source
    assert side.src_sizes is side.dataset.src_sizes and side.tgt is side.dataset.tgt
    copy = pickle.loads(pickle.dumps(side))
    assert copy[3]["src_word_ids"].equal(side[3]["src_word_ids"]) and len(copy) == len(side)
    with pytest.raises(AttributeError):
        side.no_such_attribute
