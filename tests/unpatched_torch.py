"""torch's own code in place of a torch patch of the plugin, for tests that reproduce the failure a patch fixes."""
import contextlib


@contextlib.contextmanager
def saved_activation_strides():
    """torch's own ``_aot_stage2b_bw_compile`` and ``set_tracing_context_output_strides`` while inside (a compiled
    backward's saved strides frozen at the first batch's sizes), and ``--compile`` not installing the patch again
    (``patches/saved_activation_strides.py``); the patch's functions back on leaving. Inductor's on-disk caches are
    off while inside: their keys know the patch's source, not whether it is in place, so a graph compiled with it
    would be loaded here (and one compiled here, with the failing backward, loaded by a later test with it)."""
    import torch._inductor.config as inductor_config
    from torch._functorch._aot_autograd import graph_compile
    from torch._inductor import output_code, utils

    from umst_plugin.compilation import dispatch
    from umst_plugin.patches import saved_activation_strides as patch

    dispatch.configure_dynamo()  # (installs the patch, if it was not, so that leaving restores it)
    targets = [(graph_compile, "_aot_stage2b_bw_compile"), (output_code, "set_tracing_context_output_strides"),
               (utils, "set_tracing_context_output_strides"), (patch, "install")]
    patched = [getattr(owner, name) for owner, name in targets]
    try:
        for (owner, name), function in zip(targets[:3], patched):
            setattr(owner, name, getattr(function, "__wrapped__", function))
        patch.install = lambda load=False: None
        with inductor_config.patch(fx_graph_cache=False, force_disable_caches=True):
            yield
    finally:
        for (owner, name), function in zip(targets, patched):
            setattr(owner, name, function)


def planted_layout():
    """Inductor lays a saved activation out otherwise than the traced graph, as on a GPU: its stride padding, which
    torch applies on GPUs, switched on for the CPU and dynamic shapes; no compiled code cached. With
    :func:`saved_activation_strides`, torch's own code then fails the compiled backward at the next batch size."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(disable_padding_cpu=False, pad_dynamic_shapes=True, fx_graph_cache=False,
                                 force_disable_caches=True)
