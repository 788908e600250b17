"""Make argparse-style ("legacy") models trainable from fairseq-hydra-train YAMLs.

With ``fairseq-train``, a legacy model's ``add_args`` defaults (e.g. lightconv's
``--weight-softmax`` default True) land in ``args`` because fairseq parses them
with ``argument_default=SUPPRESS``, keeping only explicit defaults. With
``fairseq-hydra-train`` the model config holds only the YAML's keys, the arch
function fills what it knows, and any other ``args.x`` read in the model fails
with ``Missing key x``. ``fill_argparse_defaults`` adds exactly the explicit
``add_args`` defaults that fairseq-train would have set, before the arch
function runs; keys the YAML gives are kept.

``install()`` wraps ``fairseq.models.build_model`` so every task gets this;
``scripts/hydra_train.py`` (used by scripts/train.sh) calls it.
"""
import argparse

from omegaconf import DictConfig, open_dict


def explicit_add_args_defaults(model_cls):
    """The Namespace that fairseq-train's model-specific group yields for no flags at all."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    group = parser.add_argument_group("model", argument_default=argparse.SUPPRESS)
    model_cls.add_args(group)
    return vars(parser.parse_args([]))


def fill_argparse_defaults(model_cfg):
    """Add a legacy model's explicit add_args defaults to a hydra model config (in place)."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY

    if not isinstance(model_cfg, DictConfig):
        return model_cfg
    name = model_cfg.get("_name", None) or model_cfg.get("arch", None)
    if name not in ARCH_MODEL_REGISTRY or ARCH_MODEL_NAME_REGISTRY.get(name) in MODEL_DATACLASS_REGISTRY:
        return model_cfg  # unknown, or a dataclass model whose config already carries its defaults
    defaults = explicit_add_args_defaults(ARCH_MODEL_REGISTRY[name])
    with open_dict(model_cfg):
        for key, value in defaults.items():
            if key not in model_cfg:
                model_cfg[key] = value
    return model_cfg


def install():
    """Wrap fairseq.models.build_model (what tasks call) to fill the defaults first. Idempotent."""
    import fairseq.models as models

    if getattr(models.build_model, "_fills_argparse_defaults", False):
        return
    original = models.build_model

    def build_model(cfg, task, from_checkpoint=False):
        fill_argparse_defaults(cfg)
        return original(cfg, task, from_checkpoint)

    build_model._fills_argparse_defaults = True
    models.build_model = build_model
