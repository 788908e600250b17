"""What a test or a benchmark asks of the layers ``--compile`` compiled (``umst_plugin.compilation``): which variants
fell back to eager and why (a benchmark row of compiled layers must say so: otherwise it counts those layers' eager
kernels as compiled ones), how many compiled variants dynamo holds per layer class, and a compiled model made eager
again."""
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from umst_plugin.compilation import find_layers, is_compiled
from umst_plugin.compilation.fallback import mode_words
from umst_plugin.compilation.state import STATE


def eager_variants():
    """{(layer forward's qualified name, variant): why} for the variants that fell back to eager in this process."""
    return {(f.__qualname__, key): why for (f, key), why in STATE.eager_variants.items()}


def compiled_forwards(model):
    """The eager ``forward`` functions of ``model``'s compiled layers (one per class), whose code objects hold
    dynamo's compiled variants (:func:`cache_entries`)."""
    seen = []
    for _, layer in find_layers(model):
        if is_compiled(layer) and layer._umst_compiled[1] not in seen:
            seen.append(layer._umst_compiled[1])
    return seen


def eager_fallbacks(model):
    """The variants of ``model``'s compiled layer classes that fell back to eager in this process, one line each
    ("Class.forward (training, autograd): forward: RuntimeError: ..."): what a benchmark of compiled layers must
    report beside its numbers, which otherwise count those layers' eager kernels as compiled ones."""
    forwards = compiled_forwards(model)
    return [f"{eager.__qualname__} ({mode_words(key)}): {why}"
            for (eager, key), why in STATE.eager_variants.items() if eager in forwards]


def fallback_tracebacks(model):
    """The tracebacks (their last 6,000 characters) of the failures behind :func:`eager_fallbacks`, in its order:
    what a report of a failed compile needs beyond the one line the warning gives."""
    forwards = compiled_forwards(model)
    return [STATE.fallback_tracebacks.get((eager, key), "") for (eager, key) in STATE.eager_variants
            if eager in forwards]


def fallback_record(model):
    """What a benchmark row of ``model`` compiled records of its fallbacks: ``eager_fallbacks`` (one line each,
    for the table) and ``eager_fallback_tracebacks`` (for a bug report)."""
    return dict(eager_fallbacks=eager_fallbacks(model), eager_fallback_tracebacks=fallback_tracebacks(model))


def cache_entries(function):
    """How many compiled variants dynamo holds for ``function`` (all instances of its class together)."""
    return len(_debug_get_cache_entry_list(function.__code__))


def uncompile_layers(model):
    """Undo ``compile_layers`` on ``model``'s layers: they run their eager ``forward`` again (a test that compiles
    only part of a model)."""
    for _, layer in find_layers(model):
        layer.__dict__.pop("_umst_compiled", None)
        layer.__dict__.pop("forward", None)
