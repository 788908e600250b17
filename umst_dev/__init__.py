"""Tools of the project's own tests and benchmarks: not installed with the plugin (``setup.py`` does not list this
package), imported from a checkout (``pytest.ini`` and the benchmarks put the repository root on the path).

* ``compiled_layers`` -- what a test or a benchmark asks of the layers ``--compile`` compiled: the variants that
  fell back to eager and why, dynamo's compiled variants per layer class, a compiled model made eager again.
"""
