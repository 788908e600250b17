"""Prime / MUSE (Zhao et al.): the parallel layer, dynamic convolution and its multi-kernel mix."""
