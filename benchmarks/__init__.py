"""The benchmarks, run from the repository root as ``python -m benchmarks <what>`` (``__main__.py`` lists them).

Shared code lives in the harness modules, which the benchmarks import and which import no benchmark: ``harness``
(the one arch table, read from the family registry, the one model builder, a batch of a length distribution),
``common`` (timing, peak memory, profiling, tables) and ``synthetic_corpus`` (length distributions and the
synthetic corpus, also a command). ``paper/<family>.py``: each family's paper table, the only benchmark modules
that name a family. ``gpu_check`` is the GPU check (``bash scripts/gpu-check.sh``): the tests, benchmarks and
speed table a lent GPU runs, in one call.
"""
