"""Bounded batch shapes: fairseq's ``--num-batch-buckets`` (every sentence padded to one of N lengths, each bucket
batched in one fixed shape) and ``--required-seq-len-multiple`` with the plugin's task. What a GPU program recorded
once per shape needs (CUDA graphs); the padding must not change the loss.

* fairseq's bucketing runs under numpy 2 (``patches/pair_dataset_sizes.py``; it stopped at the first dataset);
* the side data follows the bucket padding (each row's word ids and heads its own sentence's, laid out like its
  tokens), left and right padded;
* the buckets bound the shapes of an epoch's batches;
* every family's validation loss over the toy corpus's valid set, summed over its batches (a float64 model), is the
  same with and without bucketed or rounded-up lengths (the batches differ: sentences grouped otherwise, more
  padding).
"""
import numpy as np
import pytest
import torch

import e2e
from test_side_data import check_batches, expected_rows, task_on
from umst_dev import dev
from umst_plugin.patches import pair_dataset_sizes

BUCKETS = 4


@pytest.mark.parametrize("left_pad", [True, False], ids=["left-pad", "right-pad"])
def test_side_data_follows_the_bucket_padding(toy_databin, left_pad):
    task = task_on(toy_databin, num_batch_buckets=BUCKETS, left_pad_source=not left_pad)
    task.load_dataset("train")
    dataset = task.dataset("train")
    assert dataset.buckets  # bucketed: the items themselves carry padding
    item = dataset[int(np.argmin(dataset.dataset.src.dataset.sizes))]  # the shortest: padded in its item
    pad = task.source_dictionary.pad()
    assert item["source"].eq(pad).any() and item["src_word_ids"].eq(0).equal(item["source"].eq(pad))
    check_batches(task, "train", *expected_rows(toy_databin, "train"), left_pad=left_pad)


def test_fairseqs_buckets_under_numpy_2():
    """The patch's buckets are the lengths fairseq's ``get_buckets`` picks (the lower percentiles), which numpy 2
    refuses to compute as fairseq asks."""
    from fairseq.data import data_utils

    sizes = np.array([41, 5, 12, 3, 5, 6, 9, 12, 13, 20, 31, 40])
    # "lower": the sorted lengths at floor(q / 100 * (n - 1)) for q = 25, 50, 75, 100
    assert pair_dataset_sizes.percentile_buckets(sizes, 4).tolist() == [5, 12, 20, 41]
    if int(np.__version__.split(".")[0]) >= 2:
        with pytest.raises(TypeError, match="interpolation"):
            data_utils.get_buckets(sizes, 4)


def _shapes(task):
    itr = task.get_batch_iterator(task.dataset("train"), max_tokens=300, seed=1,
                                  required_batch_size_multiple=1).next_epoch_itr(shuffle=False)
    return {(tuple(b["net_input"]["src_tokens"].shape), tuple(b["target"].shape)) for b in itr}


def test_buckets_bound_the_shapes_of_an_epochs_batches(toy_databin):
    plain, bucketed = task_on(toy_databin), task_on(toy_databin, num_batch_buckets=BUCKETS)
    for task in (plain, bucketed):
        task.load_dataset("train")
    lengths = {s for (_, s), _ in _shapes(bucketed)} | {t for _, (_, t) in _shapes(bucketed)}
    buckets = set(bucketed.dataset("train").dataset.src.buckets) | set(bucketed.dataset("train").dataset.tgt.buckets)
    assert lengths <= buckets, (lengths, buckets)
    print(f"distinct batch shapes in an epoch: {len(_shapes(plain))} plain, {len(_shapes(bucketed))} with "
          f"{BUCKETS} buckets")
    assert len(_shapes(bucketed)) < len(_shapes(plain))


TINY = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=32,
            decoder_ffn_embed_dim=32, encoder_attention_heads=2, decoder_attention_heads=2)
NO_DEPTH = {k: v for k, v in TINY.items() if k not in ("encoder_layers", "decoder_layers")}
FAMILIES = [
    pytest.param("transformer", TINY, id="transformer"),
    pytest.param("umst_base", TINY, id="umst_base"),
    pytest.param("umst_base_rpr", {**TINY, "max_relative_positions": 4}, id="umst_base_rpr"),
    pytest.param("transformer_sf_base", {**TINY, "fast_embed_dim": 8, "fast_ffn_embed_dim": 16,
                                         "fast_attention_heads": 2}, id="transformer_sf_base"),
    pytest.param("msc_base", dict(encoder_blocks=2, encoder_layers_per_block=1, **NO_DEPTH), id="msc_base"),
    pytest.param("msmsa_base", {**TINY, "msmsa_scales": "1,3,N/4,N/2", "msmsa_min_block": 2}, id="msmsa_base"),
    pytest.param("prime_base", {**TINY, "prime_kernels": "3,7"}, id="prime_base"),
    pytest.param("prime_simple_base", TINY, id="prime_simple_base"),
]
# the largest relative difference of the summed float64 loss measured over these families was 1.9e-16 (rounding
# of the sums' order); a fault in the padding (word ids off by a position) moves it by more than 1e-3
RTOL = 1e-6


def _valid_loss(databin, arch, overrides, **padding):
    """The validation loss summed over the valid set's batches (max 300 tokens), float64, eval mode, the model's
    weights from seed 1 whatever the padding."""
    from fairseq import tasks

    args = dev.parse_args(arch, {"source_lang": e2e.SRC, "target_lang": e2e.TGT, **overrides, **padding},
                          data=databin)
    cfg = dev.config_of(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("valid")
    torch.manual_seed(1)
    model = task.build_model(cfg.model).double().eval()
    criterion = task.build_criterion(cfg.criterion)
    itr = task.get_batch_iterator(task.dataset("valid"), max_tokens=300, seed=1).next_epoch_itr(shuffle=False)
    loss, tokens, shapes = 0.0, 0, set()
    with torch.no_grad():
        for batch in itr:
            shapes.add(tuple(batch["net_input"]["src_tokens"].shape))
            batch_loss, _, log = task.valid_step(batch, model, criterion)
            loss, tokens = loss + float(batch_loss), tokens + log["ntokens"]
    return loss, tokens, shapes


@pytest.mark.parametrize("arch,overrides", FAMILIES)
def test_bucketed_and_rounded_lengths_leave_the_loss_unchanged(toy_databin, arch, overrides):
    loss, tokens, shapes = _valid_loss(toy_databin, arch, overrides)
    for padding in ({"num_batch_buckets": BUCKETS}, {"required_seq_len_multiple": 8}):
        padded_loss, padded_tokens, padded_shapes = _valid_loss(toy_databin, arch, overrides, **padding)
        assert padded_shapes != shapes and padded_tokens == tokens  # other batches, the same sentences
        print(f"{arch} {padding}: loss {padded_loss:.15g} against {loss:.15g} "
              f"({abs(padded_loss - loss) / loss:.1e} apart)")
        assert padded_loss == pytest.approx(loss, rel=RTOL), (arch, padding)
