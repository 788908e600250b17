"""The window masks of multi-scale self-attention for every head at once, built once per forward of a stack.

A head of half-width ``h`` lets query ``i`` see key ``j`` iff ``|j - i| <= h`` (causal: ``0 <= i - j <= h``),
positions being row indices (pads are contiguous at one end of a row, so index differences inside a row are
sentence-position differences). ``h`` is ``n // divisor + constant`` for the head's scale, ``n`` the sentence's
length (causal: the prefix length ``j + 1`` of the query): fixed scale ``w``: divisor "infinite", constant
``(w - 1) / 2``; relative ``N/k``: divisor ``2k``, constant 0; ``global``: divisor "infinite", constant "infinite".

:func:`window_bias` turns this into one additive bias for P heads, ``B x P x T x T`` (``1 x P x T x T`` without
padding, broadcast over the batch): 0 inside the window, ``-inf`` outside, a large finite negative at padding
keys inside the window (so a padding query, whose own position is always in its window, keeps a finite softmax
in fp16/bf16 while real queries give padding exactly zero weight). These are the values of the banded and dense
paths of ``windowed_attention`` at every key a query can reach. About ten kernels, whatever the number of heads
and scales, and no host sync: the lengths stay on the device.

:class:`WindowMasks` is shared by the attention modules of one encoder (or decoder) stack: inside
:meth:`WindowMasks.scope` (the stack's forward) the first layer builds the bias of *every* layer's heads in one
go (``B x (L*H) x T x T``, one tensor) and each layer takes its ``H`` heads as a view; the masks depend only on
the padding mask, the length and the scales, so every later layer reuses them. Outside a scope (a module called
alone, a layer recomputed in backward by activation checkpointing) and while ``torch.compile`` traces a layer,
each layer builds its own ``B x H x T x T`` bias (the compiler fuses it) and nothing is kept; the traced layer
reads its heads' rule from a tensor, so the layers of a stack share one compiled graph.

On a GPU the bias is allocated with its last dimension rounded up to 16 elements and sliced back to T, so torch's
memory-efficient attention kernel, which needs 16-element aligned strides, reads it as it is instead of padding a
copy at every call.
"""
import contextlib
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from umst_plugin.modules.common.tracing import compiling

# "infinite" divisor / reach: larger than any sequence, small enough that FAR + T fits in int64.
# (Reaches are compared after ``remainder(FAR)``: causal keys after the query land at FAR - (j - i) > FAR / 2.)
FAR = 2 ** 40
GLOBAL_REACH = FAR // 2
MEM_EFFICIENT_ALIGNMENT = 16


def pad_bias_value(dtype: torch.dtype) -> float:
    """The bias of a padding key inside a window: large and finite (fp16's range ends at 65504)."""
    return -1e4 if dtype == torch.float16 else -1e9


def half_width_constants(head_scales: Sequence) -> Tuple[List[int], List[int]]:
    """(divisor, constant) per head: half-width = n // divisor + constant for a sentence (prefix) of n tokens."""
    divisors, constants = [], []
    for scale in head_scales:
        if scale.kind == "fixed":
            divisors.append(FAR)
            constants.append((scale.value - 1) // 2)
        elif scale.kind == "relative":
            divisors.append(2 * scale.value)
            constants.append(0)
        else:  # global
            divisors.append(FAR)
            constants.append(GLOBAL_REACH)
    return divisors, constants


def window_bias(head_scales: Sequence, key_padding_mask: Optional[Tensor], length: int, causal: bool,
                dtype: torch.dtype, device, constants: Optional[Tensor] = None, align: int = 1) -> Tensor:
    """Additive window bias of the heads ``head_scales`` (P of them): ``B x P x T x T``, or ``1 x P x T x T``
    when ``key_padding_mask`` (B x T, True at padding) is None. ``constants``: the 2 x P LongTensor of
    :func:`half_width_constants` already on ``device`` (built here otherwise). ``align``: the last dimension
    is computed rounded up to a multiple of it and the T columns are returned as a view (aligned strides)."""
    if constants is None:
        constants = torch.tensor(half_width_constants(head_scales), dtype=torch.long, device=device)
    # (head_scales is only read here: with constants given it may be None)
    divisor, constant = constants[0][None, :, None], constants[1][None, :, None]
    columns = -(-length // align) * align if align > 1 else length  # what extra columns hold is never read
    keys = torch.arange(columns, device=device)
    queries = keys[:length]
    if key_padding_mask is None:
        # sentence length T for every row; causal: prefix lengths 1..T
        lengths = queries[None, :] + 1 if causal else torch.full((1, 1), length, dtype=torch.long, device=device)
        pad_term = torch.zeros((), dtype=dtype, device=device)
    else:
        if causal:
            lengths = (~key_padding_mask).cumsum(1)  # B x T: prefix length of each query
        else:
            lengths = length - key_padding_mask.sum(1, keepdim=True)  # B x 1
        if align > 1 and columns > length:
            key_padding_mask = F.pad(key_padding_mask, (0, columns - length), value=True)
        # (a 0-dim zero of the right dtype: torch.where of two Python numbers would be float32)
        pad_term = torch.where(key_padding_mask, pad_bias_value(dtype), torch.zeros((), dtype=dtype, device=device))
        pad_term = pad_term[:, None, None, :]
    half = torch.div(lengths[:, None, :], divisor, rounding_mode="floor") + constant  # B' x P x (1 | T)
    if causal:  # i - j, keys after the query pushed out of every window (FAR - (j - i) > GLOBAL_REACH)
        distance = (queries[:, None] - keys[None, :]).remainder_(FAR)
    else:
        distance = (keys[None, :] - queries[:, None]).abs_()
    inside = distance <= half[..., None]  # B' x P x T x columns
    bias = torch.where(inside, pad_term, float("-inf"))
    return bias[..., :length] if align > 1 else bias


class WindowMasks:
    """The window biases of one stack of multi-scale attention modules (module docstring).

    Each module registers its heads' scales (:meth:`register`, in the stack's order) and asks for its bias with
    :meth:`get`. Inside :meth:`scope` one bias for all registered heads is built by the first module and reused
    while the padding mask (the same tensor object, unchanged), the length, dtype, device and inference mode stay
    the same; the scope's end drops it. Outside a scope, or under ``torch.compile``, :meth:`get` builds the
    module's own heads only and keeps nothing.
    """

    def __init__(self):
        self.slots: List[Tuple[int, int]] = []  # (first head, end head) of each registered module
        self.head_scales: List = []
        self.causal: Optional[bool] = None
        self._constants: Dict[tuple, Tensor] = {}
        self._entry: Optional[tuple] = None
        self._active = False

    def register(self, head_scales: Sequence, causal: bool) -> int:
        if self.causal is not None and causal != self.causal:
            raise ValueError("one WindowMasks serves either causal or bidirectional modules, not both")
        self.causal = causal
        start = len(self.head_scales)
        self.head_scales.extend(head_scales)
        self.slots.append((start, len(self.head_scales)))
        return len(self.slots) - 1

    def _constants_on(self, device, slot: Optional[int]) -> Tensor:
        key = (str(device), slot)
        value = self._constants.get(key)
        if value is None:
            scales = self.head_scales if slot is None else self.head_scales[slice(*self.slots[slot])]
            value = torch.tensor(half_width_constants(scales), dtype=torch.long, device=device)
            self._constants[key] = value
        return value

    @contextlib.contextmanager
    def scope(self):
        """While open (a stack's forward), the first module's call builds every module's bias once."""
        outer, self._active = self._active, True
        try:
            yield self
        finally:
            self._active = outer
            if not outer:
                self._entry = None

    def clear(self):
        self._entry = None

    def get(self, slot: int, key_padding_mask: Optional[Tensor], length: int, dtype: torch.dtype, device,
            constants: Optional[Tensor] = None) -> Tensor:
        """The B' x H x T x T bias of module ``slot``'s heads (``constants``: its 2 x H rule on ``device``)."""
        start, end = self.slots[slot]
        align = MEM_EFFICIENT_ALIGNMENT if torch.device(device).type == "cuda" else 1
        if compiling():  # traced: the module's own heads, nothing kept
            return window_bias(self.head_scales[start:end], key_padding_mask, length, self.causal, dtype, device,
                               constants)
        if not self._active:
            return window_bias(self.head_scales[start:end], key_padding_mask, length, self.causal, dtype, device,
                               constants if constants is not None else self._constants_on(device, slot), align)
        key = (length, dtype, str(device), torch.is_inference_mode_enabled(),
               None if key_padding_mask is None
               else (-1 if key_padding_mask.is_inference() else key_padding_mask._version))
        entry = self._entry
        if entry is None or entry[0] is not key_padding_mask or entry[1] != key:
            bias = window_bias(self.head_scales, key_padding_mask, length, self.causal, dtype, device,
                               self._constants_on(device, None), align)
            entry = self._entry = (key_padding_mask, key, bias)
        return entry[2][:, start:end]

    def __deepcopy__(self, memo):  # a copied model (EMA, averaging) shares a fresh, empty copy
        copy = WindowMasks()
        copy.slots, copy.head_scales, copy.causal = list(self.slots), list(self.head_scales), self.causal
        return copy

    def __getstate__(self):  # pickled without cached tensors
        state = dict(self.__dict__)
        state["_constants"], state["_entry"], state["_active"] = {}, None, False
        return state
