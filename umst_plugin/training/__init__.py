"""What the plugin changes in fairseq's training, with its options (installed in the order of
``umst_plugin/features.py``):

* ``amp_dtype_flag`` -- ``--amp-dtype`` (and ``--no-amp-weight-cache``) as fairseq common options, for every task
  and CLI;
* ``fused_adam`` -- fairseq's adam (``--optimizer adam``) in torch's fused multi-tensor kernel
  (``--use-old-adam``: fairseq's loop);
* ``grad_norm`` -- the gradient norm in one multi-tensor op;
* ``preemption`` -- ``--stop-on-signals``: on SIGUSR1/SIGTERM training saves ``checkpoint_last.pt`` at the next
  update boundary every rank agrees on, and stops.

``--compile`` and ``--tf32`` live with the compile package (``umst_plugin/compilation/flags.py``).
"""
