"""umst_plugin: multiscale encoders for fairseq.

Load with ``fairseq-train --user-dir umst_plugin``. Importing the package
registers the ``multiscale_translation`` task and every architecture in
``umst_plugin/models`` (each module is imported here so that registration
happens exactly once), and allow-lists the classes fairseq checkpoints contain
so they load under torch>=2.6's ``weights_only=True`` default. It also lets
``fairseq-hydra-train`` build argparse-style models (``legacy_hydra.py``),
stops fairseq's batch-prefetch thread cleanly at exit (``prefetch_exit.py``: a
run that stops mid-epoch would otherwise abort with "terminate called without an
active exception"), and zeroes the never-initialized, unused ``conv_bias`` of
fairseq's lightconv models (``dynamicconv_init.py``), and makes ``--bf16`` mean bf16 on GPUs and CPUs
where fairseq would take it for a TPU (``mixed_precision.py``, which also holds ``--amp --amp-dtype``).
"""
import importlib
import os

from umst_plugin.checkpoint_safety import allow_fairseq_checkpoint_classes
from umst_plugin import dynamicconv_init, legacy_hydra, mixed_precision, prefetch_exit

allow_fairseq_checkpoint_classes()
legacy_hydra.install()
prefetch_exit.install()
dynamicconv_init.install()
mixed_precision.install()

__version__ = "0.1.0"


def _import_all(subpackage):
    pkg_dir = os.path.join(os.path.dirname(__file__), subpackage)
    for name in sorted(os.listdir(pkg_dir)):
        if name.endswith(".py") and not name.startswith("_"):
            importlib.import_module(f"umst_plugin.{subpackage}.{name[:-3]}")


# Registration side effects: tasks first, then models (models may look up tasks).
_import_all("tasks")
_import_all("models")
