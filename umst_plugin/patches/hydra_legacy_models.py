"""Patch: let fairseq-hydra-train build argparse-style ("legacy") models the way fairseq-train does.

``fairseq-train`` hands a legacy model (``register_model`` + ``add_args``, no
dataclass) an ``argparse.Namespace``: every flag of the run flattened into one
namespace, plus the explicit ``add_args`` defaults (``_set_legacy_defaults``),
and it stores that Namespace as ``cfg.model`` in checkpoints. ``fairseq-hydra-train``
instead passes the YAML's ``model:`` DictConfig, which breaks legacy models in two
ways: ``add_args`` defaults are missing (fairseq's lightconv fails on
``Missing key weight_softmax``), and ``TransformerConfig.from_namespace`` cannot
copy extra keys out of a DictConfig (a TransformerModel subclass such as
transformer_sf loses its own flags: ``invalid argument fast_embed_dim``).

fairseq-hydra-train imports the plugin (``common.user_dir``) inside
``fairseq_cli.train.main``, after hydra composed the config and before the task
builds the model, so importing the plugin calls ``install()``, which wraps
``fairseq.models.build_model`` (every task's ``build_model`` looks it up on the
module at call time). The wrapper acts only on a legacy arch whose config is a
DictConfig, which only a hydra-composed config gives: it builds the Namespace
fairseq-train would have built from the whole run config (the model node's
parent) and puts it in place of ``cfg.model`` there, so the trainer saves it and
the checkpoint looks like a fairseq-train one. Namespace configs (fairseq-train,
fairseq-generate/interactive on any checkpoint written that way) and dataclass
models pass through untouched.
"""
from argparse import Namespace

from omegaconf import DictConfig, OmegaConf, open_dict

from umst_plugin.patches import wrap

TARGET = "fairseq.models.build_model"
SYMPTOM = ("fairseq-hydra-train cannot build argparse-style archs: missing add_args defaults, "
           "'invalid argument fast_embed_dim'")
REMOVE_WHEN = "every arch of the plugin is a dataclass model, or fairseq builds legacy archs from DictConfigs"


def is_legacy_arch(name):
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY

    return name in ARCH_MODEL_REGISTRY and ARCH_MODEL_NAME_REGISTRY.get(name) not in MODEL_DATACLASS_REGISTRY


def legacy_model_namespace(cfg):
    """The flat Namespace fairseq-train gives a legacy model: every config group's keys (the model's
    win), the arch name, and the explicit add_args defaults for what the YAML leaves out."""
    from fairseq.dataclass.utils import _set_legacy_defaults, merge_with_parent
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    from fairseq.dataclass.configs import FairseqConfig

    name = cfg.model._name
    flat = {}
    for group, node in cfg.items():
        if group not in FairseqConfig.__dataclass_fields__:
            continue  # e.g. the job_logging_cfg fairseq-hydra-train adds: not a training flag
        if group == "task" and isinstance(node, DictConfig) and node.get("_name") in TASK_DATACLASS_REGISTRY:
            # the task's own defaults (max_source_positions, ...), as fairseq-train's parser has them;
            # hydra could not add them: the plugin's task registers only when the plugin is imported
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


def _legacy_dictconfig_name(model_cfg):
    """The arch name when ``model_cfg`` is a hydra DictConfig of a legacy arch, else None."""
    if not isinstance(model_cfg, DictConfig):
        return None
    name = getattr(model_cfg, "_name", None)
    return name if isinstance(name, str) and is_legacy_arch(name) else None


def use_legacy_namespace(cfg):
    """Replace a legacy arch's ``cfg.model`` by its fairseq-train Namespace (in place); returns cfg."""
    from fairseq.dataclass.utils import omegaconf_no_object_check

    if _legacy_dictconfig_name(cfg.get("model")) is None:
        return cfg
    ns = legacy_model_namespace(cfg)
    with omegaconf_no_object_check(), open_dict(cfg):
        cfg.model = ns
    return cfg


def model_config_for_build(model_cfg):
    """What ``fairseq.models.build_model`` should get: the fairseq-train Namespace for a legacy arch's
    DictConfig (taken from, and written back into, the whole run config when the node has one), else
    ``model_cfg`` itself."""
    name = _legacy_dictconfig_name(model_cfg)
    if name is None:
        return model_cfg
    root = model_cfg._get_parent()
    if isinstance(root, DictConfig) and model_cfg._key() == "model" and root.get("model") is model_cfg:
        return use_legacy_namespace(root).model
    # a bare model node (no run config around it): its own keys and the arch's defaults
    return legacy_model_namespace(OmegaConf.create({"model": model_cfg}))


def install():
    """Wrap ``fairseq.models.build_model`` so legacy archs get their fairseq-train Namespace (see the
    module docstring). Idempotent; the plugin's ``__init__`` calls it."""
    import fairseq.models as models

    def make(original):
        def build_model(cfg, task, from_checkpoint=False):
            return original(model_config_for_build(cfg), task, from_checkpoint)
        return build_model

    wrap(models, "build_model", make, __name__,
         "(cfg: fairseq.dataclass.configs.FairseqDataclass, task, from_checkpoint=False)")
