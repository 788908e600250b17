"""Padding a batch's rows into one tensor in a few tensor operations, where fairseq copies one row at a time.

:func:`collate_tokens` is fairseq's ``data_utils.collate_tokens`` (the same arguments, the same tensor) computed as
one concatenation and one indexed write. fairseq's runs two or three tensor operations per row: at the recipe's
38,400 tokens per card (about 800 sentences a batch of WMT14's lengths) its three calls per batch (source, previous
output tokens, target) were most of a data loader worker's time for stock fairseq and the plugin alike
(docs/performance.md, "The data loader's ceiling"). ``umst_plugin/patches/collate_tokens.py`` puts it in fairseq's
place; the side data's word ids and heads are padded with it too.
"""
import torch


def _padded_width(longest, pad_to_length, pad_to_multiple):
    size = longest if pad_to_length is None else max(longest, pad_to_length)
    if pad_to_multiple != 1 and size % pad_to_multiple != 0:
        size = int(((size - 0.1) // pad_to_multiple + 1) * pad_to_multiple)  # fairseq's rounding, as written
    return size


def vectorizable(values, move_eos_to_beginning):
    """Whether :func:`collate_tokens` computes these rows itself: 1-d tensors of one dtype on one device (fairseq's
    row copies cast each row to the first row's dtype, which one concatenation would promote instead), and no empty
    row where the end-of-sentence moves (fairseq's copy fails on it; its own error is kept)."""
    first = values[0]
    for v in values:
        if not torch.is_tensor(v) or v.dim() != 1 or v.dtype != first.dtype or v.device != first.device:
            return False
        if move_eos_to_beginning and v.size(0) == 0:
            return False
    return True


def collate_tokens(values, pad_idx, eos_idx=None, left_pad=False, move_eos_to_beginning=False, pad_to_length=None,
                   pad_to_multiple=1, pad_to_bsz=None, *, fallback=None):
    """fairseq's ``data_utils.collate_tokens``: a list of 1-d tensors as one (B x T) tensor of ``values[0]``'s dtype,
    each row at the right end (``left_pad``) or the left, the rest ``pad_idx``; T the longest row, at least
    ``pad_to_length``, rounded up to ``pad_to_multiple``; B at least ``pad_to_bsz``. With
    ``move_eos_to_beginning`` each row's last token (or ``eos_idx`` where given) comes first and the others
    follow it, as the decoder's previous output tokens.

    Rows :func:`vectorizable` does not accept go to ``fallback`` (fairseq's own, row by row) with the same
    arguments; without one, they raise ValueError."""
    if not vectorizable(values, move_eos_to_beginning):
        if fallback is None:
            raise ValueError("collate_tokens: expected 1-d tensors of one dtype on one device (and no empty row "
                             "with move_eos_to_beginning)")
        return fallback(values, pad_idx, eos_idx, left_pad, move_eos_to_beginning, pad_to_length, pad_to_multiple,
                        pad_to_bsz)
    lengths = [v.size(0) for v in values]
    size = _padded_width(max(lengths), pad_to_length, pad_to_multiple)
    batch_size = len(values) if pad_to_bsz is None else max(len(values), pad_to_bsz)
    res = values[0].new(batch_size, size).fill_(pad_idx)
    flat = torch.cat(values)
    if flat.numel() == 0:
        return res
    device = flat.device
    n = torch.tensor(lengths, device=device)
    ends = n.cumsum(0)
    starts = ends - n
    positions = torch.arange(flat.numel(), device=device)
    if move_eos_to_beginning:
        # each row shifted right by one inside itself, its last token (or eos_idx) first
        source = positions - 1
        source[starts] = ends - 1
        flat = flat[source]
        if eos_idx is not None:
            flat[starts] = eos_idx
    column = positions - starts.repeat_interleave(n)  # each token's place in its row
    if left_pad:
        column += (size - n).repeat_interleave(n)
    res[torch.arange(len(values), device=device).repeat_interleave(n), column] = flat
    return res
