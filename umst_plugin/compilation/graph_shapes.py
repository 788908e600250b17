"""A cap on the batch shapes that ``--compile-cudagraphs`` records as CUDA graphs, per layer class
(``--compile-cudagraph-shapes N``): the first N shapes a class meets are recorded and replayed; every shape after
them runs the same layer compiled without CUDA graphs (its kernels launched one by one, as ``--compile`` does).

Why: a CUDA graph holds fixed sizes, and inductor's graph trees record a new one for every new set of sizes, with
no limit (``cudagraph_trees.cudagraphify_impl``: one entry per size key; past
``triton.cudagraph_dynamic_shape_warn_limit`` it only warns). Length buckets (``--num-batch-buckets``) bound the
shapes of a run; without them, or with a corpus whose buckets still give many batch sizes, every new shape costs a
recording (a warm-up run, then the capture) and room in the graphs' memory pool, for the whole run. With the cap,
that cost is bounded and the shapes beyond it still run compiled.

The issue asked for the shapes outside the bounded set to run eager; they run compiled without graphs instead,
which computes the same function with the same kernels as the recorded shapes (eager's kernels round otherwise in
bf16) and is faster than eager. That variant is compiled at the first shape beyond the cap, once per class (the
compile seconds are logged as every compile's are).

A shape is what a graph is recorded for: the sizes of every tensor argument of the layer's forward, in training or
evaluation, with autograd or without (:func:`shape_key`). The cap counts per layer class (the class's layers share
one compiled forward, and so one set of graphs).
"""
import dataclasses
import logging

import torch

from umst_plugin.compilation import fallback
from umst_plugin.compilation.state import STATE

logger = logging.getLogger(__package__)

# The default cap, per layer class. On the speed table's synthetic corpus of WMT14 lengths at the recipe's 38,400
# tokens, an epoch's batches come in 16 encoder / 17 decoder shapes with 8 buckets, 27 / 28 with 16 buckets, one per
# batch without buckets; validation adds a few. 64 holds a bucketed run's shapes, training and validation, and
# bounds an unbucketed one.
DEFAULT_SHAPES = 64


@dataclasses.dataclass
class ShapeCap:
    """One layer class's cap: at most ``limit`` shapes recorded, the rest through ``graphless``."""
    limit: int
    graphless: object  # the class's forward compiled without CUDA graphs (torch.compile's default mode)
    recorded: set = dataclasses.field(default_factory=set)
    beyond: int = 0  # calls that ran graph-less
    warned: bool = False


def _sizes(value):
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, (list, tuple)):
        return tuple(_sizes(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _sizes(v)) for k, v in value.items())
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return type(value).__name__


def check_limit(limit):
    """``limit`` as a cap (``--compile-cudagraph-shapes``); ValueError for one that is not 0 or more."""
    if limit is None or limit < 0:
        raise ValueError(f"--compile-cudagraph-shapes must be 0 (no cap) or more, not {limit}")
    return limit


def shape_key(layer, args, kwargs):
    """What a recorded graph is keyed on here: train / eval, autograd, and every tensor argument's sizes."""
    return (layer.training, torch.is_grad_enabled(), _sizes(args), _sizes(kwargs))


def cap(compiled, limit, graphless):
    """Cap the shapes recorded through ``compiled`` (a class's forward compiled with CUDA graphs) at ``limit``. The
    first cap set for a class holds for the process, as its recorded graphs do (inductor keeps them per compiled
    graph, for every model of the class built since)."""
    if compiled not in STATE.graph_caps:
        STATE.graph_caps[compiled] = ShapeCap(limit, graphless)
    return STATE.graph_caps[compiled]


def pick(layer, eager, compiled, args, kwargs):
    """The compiled forward to run this call through: ``compiled`` for a shape already recorded or while the
    class's cap has room (the shape is then recorded), the graph-less variant beyond it (a warning, once per
    class)."""
    shape_cap = STATE.graph_caps.get(compiled)
    if shape_cap is None:
        return compiled
    key = shape_key(layer, args, kwargs)
    if key in shape_cap.recorded:
        return compiled
    if len(shape_cap.recorded) < shape_cap.limit:
        shape_cap.recorded.add(key)
        # (a recording costs a warm-up run and the capture, and room in the graphs' pool: say when it happens)
        logger.info("--compile-cudagraphs: %s: batch shape %d of at most %d recorded as CUDA graphs (%s)",
                    eager.__qualname__, len(shape_cap.recorded), shape_cap.limit, fallback.shapes(args, kwargs))
        return compiled
    shape_cap.beyond += 1
    if not shape_cap.warned:
        shape_cap.warned = True
        logger.warning("--compile-cudagraphs: %s met a batch shape beyond the %d it records as CUDA graphs (%s); "
                       "that shape and every new one after it run compiled without CUDA graphs "
                       "(--compile-cudagraph-shapes N raises the cap; --num-batch-buckets N bounds the shapes)",
                       eager.__qualname__, shape_cap.limit, fallback.shapes(args, kwargs))
    return shape_cap.graphless


def counts():
    """Per layer class (its forward's qualified name): shapes recorded, calls run graph-less."""
    out = {}
    for compiled, shape_cap in STATE.graph_caps.items():
        out[getattr(compiled, "__qualname__", repr(compiled))] = (len(shape_cap.recorded), shape_cap.beyond)
    return out
