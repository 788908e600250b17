"""umst_plugin: multiscale encoders for fairseq.

Load with ``fairseq-train --user-dir umst_plugin``. Importing the package

1. installs the plugin's fixes of fairseq and torch internals (``umst_plugin/patches``: one module per target,
   each checking the code it replaces), then its features that change fairseq's code, each living with what it
   serves (``umst_plugin/features.py`` lists them in install order: ``--amp-dtype``, the fused adam, the
   gradient norm, ``--compile`` / ``--tf32``, ``--stop-on-signals``); ``python -m umst_plugin.patches`` lists
   both;
2. registers the ``multiscale_translation`` task (``umst_plugin/tasks``);
3. registers every architecture (``umst_plugin/models``: each family's package imported here, so that it
   registers its model, its archs and its family exactly once).

``umst_plugin.from_pretrained(model_dir, checkpoint_file=..., data_name_or_path=DATA_BIN)`` loads any
checkpoint (any arch, fairseq's transformer included, trained under the plugin's task or fairseq's
``translation``) as fairseq's hub interface, with the data-bin's recorded text preprocessing and the
checkpoint's precision rules (``umst_plugin/hub.py``, docs/inference.md).
"""
import importlib
import os

from umst_plugin import features, patches

__version__ = "0.1.0"

patches.install_all()  # the fixes first (patches.PATCHES order), then the features (features.FEATURES order)
features.install_all()


def _import_all(subpackage):
    """Import every module and package of ``subpackage`` (sorted; ``_private`` ones left out): a model family is a
    package (``models/<family>/``) that registers itself on import."""
    pkg_dir = os.path.join(os.path.dirname(__file__), subpackage)
    for name in sorted(os.listdir(pkg_dir)):
        if name.startswith("_"):
            continue
        if name.endswith(".py"):
            importlib.import_module(f"umst_plugin.{subpackage}.{name[:-3]}")
        elif os.path.isfile(os.path.join(pkg_dir, name, "__init__.py")):
            importlib.import_module(f"umst_plugin.{subpackage}.{name}")


# Registration side effects: tasks first, then models (models may look up tasks).
_import_all("tasks")
_import_all("models")

from umst_plugin.hub import from_pretrained  # noqa: E402  (after registration: it loads registered archs)
