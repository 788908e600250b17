"""Train argparse-style ("legacy") models from fairseq-hydra-train YAMLs the way fairseq-train does.

``fairseq-train`` hands a legacy model (``register_model`` + ``add_args``, no
dataclass) an ``argparse.Namespace``: every flag of the run flattened into one
namespace, plus the explicit ``add_args`` defaults (``_set_legacy_defaults``),
and it stores that Namespace as ``cfg.model`` in checkpoints. ``fairseq-hydra-train``
instead passes the YAML's ``model:`` DictConfig, which breaks legacy models in two
ways: ``add_args`` defaults are missing (fairseq's lightconv fails on
``Missing key weight_softmax``), and ``TransformerConfig.from_namespace`` cannot
copy extra keys out of a DictConfig (a TransformerModel subclass such as
transformer_sf loses its own flags: ``invalid argument fast_embed_dim``).
Checkpoints written that way do not load in fairseq-generate either.

``legacy_model_namespace`` builds the Namespace fairseq-train would have built;
``install()`` makes ``fairseq_cli.hydra_train`` use it (``scripts/hydra_train.py``,
and so ``scripts/train.sh``, call it). Dataclass models are left alone.
"""
from argparse import Namespace

from omegaconf import DictConfig, OmegaConf, open_dict


def is_legacy_arch(name):
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY

    return name in ARCH_MODEL_REGISTRY and ARCH_MODEL_NAME_REGISTRY.get(name) not in MODEL_DATACLASS_REGISTRY


def legacy_model_namespace(cfg):
    """The flat Namespace fairseq-train gives a legacy model: every config group's keys (the model's
    win), the arch name, and the explicit add_args defaults for what the YAML leaves out."""
    from fairseq.dataclass.utils import _set_legacy_defaults
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq.dataclass.utils import merge_with_parent
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    name = cfg.model._name
    flat = {}
    for group, node in cfg.items():
        if group == "task" and isinstance(node, DictConfig) and node.get("_name") in TASK_DATACLASS_REGISTRY:
            # the task's own defaults (max_source_positions, ...), as fairseq-train's parser has them
            node = merge_with_parent(TASK_DATACLASS_REGISTRY[node._name](), node)
        if group != "model" and isinstance(node, DictConfig):
            for key, value in OmegaConf.to_container(node, resolve=True, enum_to_str=True).items():
                if key != "_name":
                    flat.setdefault(key, value)
    model = OmegaConf.to_container(cfg.model, resolve=True, enum_to_str=True)
    flat.update({k: v for k, v in model.items() if k != "_name"})
    ns = Namespace(**flat)
    ns.arch = name
    _set_legacy_defaults(ns, ARCH_MODEL_REGISTRY[name])
    ns._name = name
    return ns


def use_legacy_namespace(cfg):
    """Replace a legacy arch's ``cfg.model`` by its fairseq-train Namespace (in place)."""
    from fairseq.dataclass.utils import omegaconf_no_object_check

    name = cfg.model.get("_name", None) if isinstance(cfg.model, DictConfig) else None
    if name is None or not is_legacy_arch(name):
        return cfg
    ns = legacy_model_namespace(cfg)
    with omegaconf_no_object_check(), open_dict(cfg):
        cfg.model = ns
    return cfg


def pre_main(cfg, **kwargs):
    """fairseq_cli.train.main, with the legacy model config converted first. Module-level, so that
    fairseq's multi-GPU spawn can pickle it; each worker converts its own copy."""
    from fairseq import utils
    from fairseq_cli.train import main

    utils.import_user_module(cfg.common)  # the plugin's archs must be registered to tell legacy ones
    return main(use_legacy_namespace(cfg), **kwargs)


def install():
    """Make fairseq_cli.hydra_train train through ``pre_main`` above. Idempotent."""
    import fairseq_cli.hydra_train as hydra_train

    hydra_train.pre_main = pre_main
