"""The plugin's features that change fairseq's code, each living with what it serves: the options the plugin adds
to fairseq's CLIs and what stands in for fairseq's own code on every run. The fixes of fairseq's and torch's bugs
are ``umst_plugin/patches``; both change fairseq's functions through ``patches.wrap``.

Importing the plugin installs the fixes (``patches.install_all``), then these (:func:`install_all`), in the order
of :data:`FEATURES`: the order matters where two wrap one function (``Trainer.__init__``: ``--compile``'s set-up
runs before ``--stop-on-signals``'s) and for the order of the options in fairseq's common options (``--amp-dtype``
and ``--no-amp-weight-cache``, then ``--compile`` and ``--tf32``, after ``--amp-scale-window``;
``--stop-on-signals`` last). Each module names its ``OPTIONS``, ``TARGET``, ``SYMPTOM`` and ``REMOVE_WHEN`` as a
patch does; :data:`STOCK_NUMBERS` says whether it changes a stock fairseq run's numbers.

``python -m umst_plugin.patches`` prints their table after the fixes' (docs/install.md).
"""
from umst_plugin.compilation import flags as compile_flags
from umst_plugin.training import amp_dtype_flag, fused_adam, grad_norm, preemption

# In install order.
FEATURES = (amp_dtype_flag, fused_adam, grad_norm, compile_flags, preemption)

# module -> does it change the numbers of a stock fairseq run once the plugin is loaded
STOCK_NUMBERS = {
    amp_dtype_flag: "no: adds --amp-dtype (default float16, fairseq's)",
    fused_adam: "no: fairseq's adam's update to float32 rounding (a stock fp32 transformer's losses agree to "
                "2.3e-7 relative over 50 updates); --use-old-adam gives fairseq's loop",
    grad_norm: "no: the same per-tensor float32 norms and clip coefficient, summed in another order (rounding)",
    compile_flags: "no unless --compile or --tf32 is given (both off by default)",
    preemption: "no: on SIGUSR1/SIGTERM a run saves and stops instead of dying; the updates are the same",
}


def install_all():
    """Install every feature (idempotent). Called once, on ``import umst_plugin``, after the fixes."""
    for module in FEATURES:
        module.install()


def path(module):
    """'umst_plugin/training/fused_adam.py': where a feature lives."""
    return module.__name__.replace(".", "/") + ".py"


def table():
    """(module path, options, target, symptom, changes a stock run's numbers, remove when) of every feature."""
    return [(path(m), m.OPTIONS, m.TARGET, m.SYMPTOM, STOCK_NUMBERS[m], m.REMOVE_WHEN) for m in FEATURES]


def markdown_table():
    lines = ["| feature | options | target | without it | changes a stock run's numbers | remove when |",
             "|---|---|---|---|---|---|"]
    lines += [f"| `{where}` | {options} | `{target}` | {symptom} | {stock} | {remove} |"
              for where, options, target, symptom, stock, remove in table()]
    return "\n".join(lines)
