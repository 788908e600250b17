"""Regional compilation (``--compile``) and TF32 matmuls (``--tf32``).

``--compile`` compiles every encoder and decoder layer of a model with ``torch.compile`` (PyTorch's "regional
compilation": the layers, not the whole model). Layers of one class run the same compiled code: the class's
``forward`` is compiled once, and dynamo keeps its graphs on that function's code object, reused by every
instance whose attributes pass the same guards -- a 6-layer encoder compiles one graph, not six (and a decoder's
layers share one too, since ``patches/incremental_state_lookup.py`` keeps their per-layer state keys out of it).

* **Dynamic shapes.** Batch size and sequence lengths are symbolic from the first call (``dynamic=True``): the
  batches of an epoch, whatever their shapes, run the graphs compiled at warm-up. A few variants are compiled
  once each when first met: training (train mode, autograd) and evaluation (eval mode, no autograd); a batch
  without padding where fairseq then passes no padding mask; fairseq's decoder's causal mask sliced from a
  larger buffer; sizes 0 and 1, which torch specialises (a batch of one sentence).
* **The loss too.** fairseq-train also compiles the criterion's loss where it is fairseq's label-smoothed
  cross-entropy (every recipe's): the float32 log-softmax over the vocabulary and the label-smoothed sums, fairseq's
  own code as one more region, which inductor fuses into three kernels instead of eager's 24-26 passes over the logits
  (``loss``; other criteria, an adaptive softmax, and a model whose log-probabilities add a term run eager).
* **Incremental decoding stays eager.** A decoder layer called with an ``incremental_state`` (beam search, one
  step at a time) runs its ordinary ``forward``; full-sequence calls (training, validation, scoring, the encoder
  in decoding) run the compiled one.
* **No graph breaks inside a layer** (``fullgraph=True``): a layer is compiled whole or not at all.
* **Loud, and never fatal after start-up.** :func:`check_available` compiles and runs a tiny function on the
  device at start-up, so a missing C++ compiler (inductor on a CPU) or an unsupported GPU (Triton) stops the run
  before training, with the cause. A compile that fails later -- a layer's first call, a recompile, compiled
  code failing at run time (a graph break, the recompile limit, an inductor error) -- does not end the run: that
  variant of the layer class runs eager from then on, with a warning naming the class, the shapes and the error
  (``fallback``); an update whose compiled backward failed is retried with that variant eager (``retry``).
* **Compiled code kept with the run** (:func:`use_cache_dir`): fairseq-train keeps inductor's caches under
  ``SAVE_DIR/compile_cache``, so a resumed or requeued run compiles from them.
* **The compile time is logged**: each compiled call that compiled something logs the layer class, the mode and
  the seconds it took; :func:`compile_seconds` is dynamo's total (backward graphs, compiled at the first backward,
  included), and fairseq-train logs it per update that compiled, with the cache's hits and misses.

dynamo settings while ``--compile`` is on (process-wide, ``dispatch.configure_dynamo``): Python floats are
constants (``specialize_float``: a dropout rate or a scale fraction is not a graph input, which torch 2.13 would
otherwise make symbolic and then fail to pass through ``torch.utils.checkpoint``); no duck sizing
(``use_duck_shape``: sizes that happen to be equal in the first batch, such as as many words as tokens, do not
become one symbol that the next batch breaks); at least ``fallback.RECOMPILE_LIMIT`` variants per layer class, and
an error when a limit is hit (which falls back to eager for that variant, with the warning); AOTAutograd's cache
keeps graphs that call custom autograd Functions (``dispatch.allow_custom_functions_in_autograd_cache``).

``--tf32`` (:func:`set_tf32`): fp32 matmuls on TensorFloat-32 tensor cores (Ampere and newer GPUs).

Outside fairseq: ``compile_layers(model)`` compiles a built model the same way (``python -m benchmarks
archs --compile``).

The modules, one concern each:

* ``regions`` -- which modules are compiled: fairseq's transformer layers and every class with
  ``compile_region = True`` (each family's layers declare it; this package imports no family);
* ``loss`` -- the criterion's loss as a region (:func:`compile_criterion`);
* ``probe`` -- can torch.compile run here (:func:`check_available`, :class:`CompileUnavailable`);
* ``dispatch`` -- compiling the layers (:func:`compile_layers`) and what a compiled layer's ``forward`` runs;
* ``fallback`` -- a failed compile: that variant eager, the warning and its reason;
* ``retry`` -- an update whose compiled backward failed, retried: every step of it in one place;
* ``graph_shapes`` -- ``--compile-cudagraphs``' cap on the batch shapes each layer class records as CUDA graphs;
* ``cache`` -- inductor's caches kept in ``SAVE_DIR/compile_cache``;
* ``telemetry`` -- compile seconds, graphs and cache hits, logged;
* ``tf32`` -- ``--tf32``;
* ``state`` -- everything the others keep while the process runs, in one object (``STATE``);
* ``flags`` -- the options ``--compile`` and ``--tf32`` in fairseq's CLIs, and where fairseq-train, -validate,
  -generate and -interactive apply them (installed on plugin import, ``umst_plugin/features.py``).

torch's compiler (``torch._dynamo``, ``torch._inductor``) is imported where it is used, inside the functions that
compile: importing it takes about a second, which a run without ``--compile`` does not pay.
"""
from umst_plugin.compilation.cache import CACHE_DIRNAME, use_cache_dir
from umst_plugin.compilation.dispatch import compile_layers, is_compiled, layers_eager
from umst_plugin.compilation.loss import compile_criterion
from umst_plugin.compilation.probe import CompileUnavailable, check_available
from umst_plugin.compilation.regions import describe, find_layers, is_compile_region
from umst_plugin.compilation.retry import CompileFailure
from umst_plugin.compilation.telemetry import CompileTimeLog, compile_seconds, compiled_graphs
from umst_plugin.compilation.tf32 import set_tf32, tf32_supported

__all__ = ["CACHE_DIRNAME", "CompileFailure", "CompileTimeLog", "CompileUnavailable", "check_available",
           "compile_criterion", "compile_layers", "compile_seconds", "compiled_graphs", "describe", "find_layers",
           "is_compile_region", "is_compiled", "layers_eager", "set_tf32", "tf32_supported", "use_cache_dir"]
