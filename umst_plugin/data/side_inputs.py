"""The side inputs a batch carries besides the tokens, and their contract, in one place.

``multiscale_translation`` adds to ``net_input``:

* ``src_word_ids`` (B x T, laid out exactly like ``src_tokens``): 0 at padding, else the 1-based word of each
  subword; ``</s>`` is a word of its own;
* ``src_word_heads`` (B x W): position w holds the head of word w + 1 (0 = root), right-padded with -1;
* host-side *batch hints* (plain Python values, never moved to a device) that a model asks for through
  ``host_batch_hint()``: sizes that depend on the batch's content, computed here on the host so the model needs
  no host-device sync to learn them (TranSFormer: ``src_char_len``, the longest character sequence).

:func:`check_side_inputs` is the contract's value check; the collater runs it on every batch while the tensors are
still on the host (free), the model only under ``UMST_DEBUG_CHECKS=1``.
"""
import inspect

from torch import Tensor

SIDE_INPUT_KEYS = ("src_word_ids", "src_word_heads")
HINT_KEYS = ("src_char_len",)

SIDE_INPUT_CONTRACT = (
    "word ids must be 0 exactly at padding, the number of words (max word id) must equal the number of heads "
    ">= 0, and every head must lie in [0, n_words] (padding -1)")


def encoder_input_names(model):
    """The side inputs and hints ``model.encoder.forward`` names: the only ones the task hands it (one policy:
    no model accepts side inputs only to ignore them)."""
    encoder = getattr(model, "encoder", None)
    if encoder is None:
        return set()
    return set(inspect.signature(encoder.forward).parameters) & set(SIDE_INPUT_KEYS + HINT_KEYS)


def encoder_accepts_side_inputs(model):
    """Whether ``model.encoder.forward`` takes src_word_ids (by name)."""
    return "src_word_ids" in encoder_input_names(model)


def keep_named_inputs(net_input, models):
    """``net_input`` without the side inputs and hints that not every one of ``models`` names."""
    named = set.intersection(*(encoder_input_names(m) for m in models)) if models else set()
    drop = set(SIDE_INPUT_KEYS + HINT_KEYS) - named
    return {k: v for k, v in net_input.items() if k not in drop}


def check_side_input_shapes(src_tokens: Tensor, word_ids: Tensor, word_heads: Tensor):
    """Raise a clear error when the side inputs are missing or misshapen (shapes only: no host-device sync)."""
    if word_ids is None or word_heads is None:
        raise ValueError(
            "UMST needs src_word_ids and src_word_heads in net_input: train and decode with "
            "--task multiscale_translation (the plain translation task does not provide them)"
        )
    if word_ids.shape != src_tokens.shape:
        raise ValueError(
            f"src_word_ids must be laid out like src_tokens {tuple(src_tokens.shape)}; got {tuple(word_ids.shape)}"
        )
    if word_heads.dim() != 2 or word_heads.size(0) != src_tokens.size(0):
        raise ValueError(f"src_word_heads must be B x W with B={src_tokens.size(0)}; got {tuple(word_heads.shape)}")


def side_input_problems(src_tokens: Tensor, word_ids: Tensor, word_heads: Tensor, padding_idx: int) -> Tensor:
    """B bool: which sentences' side inputs break the contract (vectorised; no sync by itself)."""
    pad = src_tokens.eq(padding_idx)
    n_words = word_ids.max(dim=1).values
    n_heads = word_heads.ge(0).sum(dim=1)
    return (
        (word_ids.eq(0) != pad).any(dim=1)
        | word_ids.lt(0).any(dim=1)
        | (n_words != n_heads)
        | word_heads.ge(n_heads.unsqueeze(1) + 1).any(dim=1)
        | word_heads.lt(-1).any(dim=1)
    )


def check_side_inputs(src_tokens: Tensor, word_ids: Tensor, word_heads: Tensor, padding_idx: int, ids=None):
    """Shapes and values; reads the result on the host (a sync if the tensors are on a GPU). ``ids``: the
    sentences' dataset ids, named in the error."""
    check_side_input_shapes(src_tokens, word_ids, word_heads)
    bad = side_input_problems(src_tokens, word_ids, word_heads, padding_idx)
    if bool(bad.any()):
        rows = bad.nonzero().flatten().tolist()
        where = f"sentences {[int(ids[r]) for r in rows[:5]]}" if ids is not None else f"batch rows {rows[:5]}"
        raise ValueError(f"src_word_ids / src_word_heads are inconsistent with src_tokens ({where}): "
                         f"{SIDE_INPUT_CONTRACT}")


class BatchHints:
    """The host-side hints the loaded model(s) asked for: callables ``src_tokens -> {name: value}``, run by the
    collater on each batch. The task owns one and hands it to every dataset it builds; models register theirs
    when the task builds them (fairseq-generate loads the data before the model: the collater reads the
    current list at collate time). Picklable, for DataLoader workers."""

    def __init__(self):
        self.fns = {}

    def register(self, name, fn):
        self.fns[name] = fn

    def __call__(self, src_tokens):
        out = {}
        for fn in self.fns.values():
            out.update(fn(src_tokens))
        return out
