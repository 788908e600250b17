"""Tools of the project's own tests and benchmarks: not installed with the plugin (``setup.py`` does not list this
package), imported from a checkout (``pytest.ini`` and the benchmarks put the repository root on the path). No
module of ``umst_plugin`` imports this package; where a tool needs the plugin to behave otherwise, it sets a switch
the plugin owns (``umst_plugin.modules.common.attention.gpu_paths_on_cpu``).

* ``dev`` -- build any registered arch on a synthetic vocabulary through fairseq's real argument parsing, and make
  real batches (collated by the task's own dataset classes) without a data-bin.
* ``compiled_layers`` -- what a test or a benchmark asks of the layers ``--compile`` compiled: the variants that
  fell back to eager and why, dynamo's compiled variants per layer class, a compiled model made eager again.
* ``op_counts`` -- kernel launches, fp32-only matmuls and host-device syncs counted on any device
  (``TorchDispatchMode`` and the profiler); imports torch only.
* ``simulated_gpu`` -- a GPU's compiled programs generated and counted on a CPU (inductor's Triton lowering).
* ``fairseq_source`` -- the light build of fairseq-fixed from its source archive that the GPU check
  (``benchmarks/gpu_check.py``) installs.
* ``argv`` -- model arguments as a dict -> fairseq's command-line flags (imports nothing of the plugin).
* ``find_nonfinite``, ``sdpa_backends`` -- debugging tools (``python -m umst_dev.find_nonfinite``, ...): the first
  module with a non-finite output or gradient in a mixed-precision step; torch's attention backends against a
  float64 reference.
* ``mutation`` -- the mutation check (``python -m umst_dev.mutation``: faults planted one at a time, each against
  the tests that claim to guard it).
"""
