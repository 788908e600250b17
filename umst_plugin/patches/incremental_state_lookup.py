"""Patch: fairseq's incremental-state lookup returns early when there is no incremental state.

``FairseqIncrementalState.get_incremental_state`` builds the module's state key -- its per-instance
``_incremental_state_id`` (a random UUID) joined with the key name -- before it looks whether there is an
incremental state at all. fairseq's decoder layer asks its self-attention for its buffer on every call, training
included (``_self_attn_input_buffer = self.self_attn._get_input_buffer(incremental_state)``). Under
``--compile`` dynamo traces that read of a per-instance string and guards on its value, so every decoder layer
failed the guards of the others and compiled a program of its own: a 6-layer decoder compiled 6 identical
programs per variant (the compiler's cache made the copies quick, ~1 s each, but each took a slot of the
per-class recompile limit and dynamo's guard checks ran over all of them at every call).

``install()`` (on plugin import) replaces it with the same lookup, testing for ``None`` first: the same result
in every case (``None`` without a state, the stored value or ``None`` with one), and the key is no longer read
where there is no state, so the decoder layers of a stack share one compiled program as the encoder layers do.
"""
from typing import Dict, Optional

from torch import Tensor

from umst_plugin.patches import wrap

TARGET = "fairseq.incremental_decoding_utils.FairseqIncrementalState.get_incremental_state"
SYMPTOM = ("--compile compiled one program per decoder layer (the per-layer state key was read, and guarded on, "
           "even without an incremental state)")
REMOVE_WHEN = "fairseq tests for a missing incremental state before building the key"


def get_incremental_state(
    self,
    incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
    key: str,
) -> Optional[Dict[str, Optional[Tensor]]]:
    """Helper for getting incremental state for an nn.Module (``None`` first: see the module docstring)."""
    if incremental_state is None:
        return None
    full_key = self._get_full_incremental_state_key(key)
    if full_key not in incremental_state:
        return None
    return incremental_state[full_key]


def install():
    from fairseq.incremental_decoding_utils import FairseqIncrementalState

    wrap(FairseqIncrementalState, "get_incremental_state", lambda original: get_incremental_state, __name__,
         "(self, incremental_state: Optional[Dict[str, Dict[str, Optional[torch.Tensor]]]], key: str) "
         "-> Optional[Dict[str, Optional[torch.Tensor]]]")
