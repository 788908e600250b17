import numpy as np
import pytest
import torch

from umst_plugin.modules.common.group_gcn import GroupGCN, group_mean, normalized_group_adjacency


def numpy_reference_adjacency(group_ids):
    """D^-1/2 (A + I) D^-1/2 from the definition: A links distinct positions of one group."""
    ids = np.asarray(group_ids)
    batch, length = ids.shape
    out = np.zeros((batch, length, length))
    for b in range(batch):
        a = np.zeros((length, length))
        for i in range(length):
            for j in range(length):
                if i != j and ids[b, i] > 0 and ids[b, i] == ids[b, j]:
                    a[i, j] = 1.0
        a_tilde = a + np.diag((ids[b] > 0).astype(float))  # self loops on real positions only
        deg = a_tilde.sum(1)
        inv = np.where(deg > 0, 1.0 / np.sqrt(np.maximum(deg, 1e-12)), 0.0)
        out[b] = inv[:, None] * a_tilde * inv[None, :]
    return out


# Left padding, right padding, non-contiguous ids, singleton groups, an all-padding row.
GROUP_IDS = torch.tensor(
    [
        [0, 0, 1, 1, 2, 3, 3, 3],
        [1, 2, 2, 5, 5, 5, 0, 0],
        [4, 4, 1, 1, 4, 2, 2, 2],
        [0, 0, 0, 0, 0, 0, 0, 0],
    ]
)


def test_dense_adjacency_matches_definition():
    ours = normalized_group_adjacency(GROUP_IDS, dtype=torch.float64).numpy()
    np.testing.assert_allclose(ours, numpy_reference_adjacency(GROUP_IDS), atol=1e-12)


@pytest.mark.parametrize("time_first", [False, True])
def test_group_mean_equals_dense_product(time_first):
    torch.manual_seed(0)
    x = torch.randn(4, 8, 5, dtype=torch.float64)
    expected = torch.from_numpy(numpy_reference_adjacency(GROUP_IDS)) @ x
    inp = x.transpose(0, 1) if time_first else x
    got = group_mean(inp, GROUP_IDS, time_first=time_first)
    if time_first:
        got = got.transpose(0, 1)
    torch.testing.assert_close(got, expected)
    assert torch.all(got[GROUP_IDS == 0] == 0)
    # A static upper bound on the ids (no device sync) gives the same result.
    bounded = group_mean(inp, GROUP_IDS, time_first=time_first, num_groups=2 * GROUP_IDS.size(1) + 1)
    torch.testing.assert_close(bounded, got.transpose(0, 1) if time_first else got)


def test_group_mean_half_precision_no_overflow():
    x = torch.full((1, 6, 3), 60000.0, dtype=torch.float16)  # sum of 6 would overflow fp16
    out = group_mean(x, torch.ones(1, 6, dtype=torch.long))
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert torch.allclose(out.float(), torch.full((1, 6, 3), 60000.0), rtol=1e-3)


def test_gcn_block_matches_dense_formula():
    torch.manual_seed(0)
    block = GroupGCN(6).double().eval()
    x = torch.randn(4, 8, 6, dtype=torch.float64)
    adj = torch.from_numpy(numpy_reference_adjacency(GROUP_IDS))
    h = adj @ block.layer_norm(x)
    expected = x + adj @ torch.relu(h @ block.linear.weight.T + block.linear.bias)
    torch.testing.assert_close(block(x, GROUP_IDS), expected)
    # Padding positions pass through unchanged.
    torch.testing.assert_close(block(x, GROUP_IDS)[GROUP_IDS == 0], x[GROUP_IDS == 0])


def test_gcn_sentences_independent_of_batch_and_padding():
    torch.manual_seed(0)
    block = GroupGCN(6).eval()
    x = torch.randn(1, 5, 6)
    ids = torch.tensor([[1, 1, 2, 3, 3]])
    alone = block(x, ids)
    # Same sentence left-padded by 3 inside a batch with another sentence reusing the same ids.
    x_pad = torch.cat([torch.randn(1, 3, 6), x], dim=1)
    ids_pad = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    other = torch.randn(1, 8, 6)
    batched = block(torch.cat([x_pad, other]), torch.cat([ids_pad, torch.tensor([[1, 1, 1, 2, 2, 3, 3, 3]])]))
    torch.testing.assert_close(batched[0, 3:], alone[0])


def test_dropout_only_in_training():
    block = GroupGCN(6, dropout=0.5, activation_dropout=0.5)
    x = torch.randn(2, 4, 6)
    ids = torch.tensor([[1, 1, 2, 2], [1, 2, 3, 0]])
    block.eval()
    torch.testing.assert_close(block(x, ids), block(x, ids))
    block.train()
    torch.manual_seed(1)
    a = block(x, ids)
    torch.manual_seed(2)
    assert not torch.allclose(a, block(x, ids))


def test_bad_group_ids_raise():
    with pytest.raises(ValueError, match="group_ids must be B x L"):
        group_mean(torch.randn(2, 4, 3), torch.ones(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="group_ids must be B x L"):  # right B and L, one dimension too many
        group_mean(torch.randn(2, 4, 3), torch.ones(2, 4, 1, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        group_mean(torch.randn(2, 4, 3), torch.ones(2, 4))


@pytest.mark.parametrize("batch, length", [(0, 4), (2, 0)])
def test_an_empty_batch_passes_through(batch, length):
    """No sentences, or sentences of no positions: an empty result of x's shape (there is no max id to read)."""
    ids = torch.zeros(batch, length, dtype=torch.long)
    assert group_mean(torch.randn(batch, length, 3), ids).shape == (batch, length, 3)
    assert group_mean(torch.randn(length, batch, 3), ids, time_first=True).shape == (length, batch, 3)
    x = torch.randn(batch, length, 3)
    assert torch.equal(GroupGCN(3)(x, ids), x)


def test_the_block_reads_no_ids_when_given_their_bound():
    """``num_groups`` given (the encoders pass a static bound): the block never reads the ids, which on a GPU is a
    host-device sync per call; meta tensors, which cannot be read, prove it. Without the bound it reads them."""
    block = GroupGCN(3).to("meta")
    x, ids = torch.empty(2, 5, 3, device="meta"), torch.empty(2, 5, dtype=torch.long, device="meta")
    assert block(x, ids, num_groups=6).shape == (2, 5, 3)
    with pytest.raises(RuntimeError, match="meta"):
        block(x, ids)
