"""Patch: fairseq-generate tells the plugin its command line's ``--amp`` and ``--amp-dtype``, as the other CLIs do.

fairseq-train, -validate, -interactive and -hydra-train enter through ``distributed_utils.call_main``, where
``patches/bf16_cli_flag.py`` records whether the command line asked for ``--amp`` and in which ``--amp-dtype``
(the precision of validation and decoding, ``mixed_precision.inference_amp``). fairseq-generate calls its
``main`` directly: under ``--task multiscale_translation`` the task config carried ``--amp`` and
``--amp-dtype``, but under fairseq's ``--task translation`` ``fairseq-generate --amp --amp-dtype bfloat16``
decoded in fp32. The patch wraps ``fairseq_cli.generate.main`` (``cli_main`` looks it up at call time, after
``--user-dir`` imported the plugin) to record the same from its config first.
"""
from umst_plugin import mixed_precision
from umst_plugin.patches import as_config, wrap

TARGET = "fairseq_cli.generate.main"
SYMPTOM = "fairseq-generate --task translation --amp --amp-dtype bfloat16 decodes in fp32"
REMOVE_WHEN = "fairseq-generate enters through distributed_utils.call_main like the other CLIs, or autocasts itself"


def install():
    import fairseq_cli.generate as generate

    def make(original):
        def main(cfg):
            cfg = as_config(cfg)
            mixed_precision.record_command_line(cfg)
            return original(cfg)
        return main

    wrap(generate, "main", make, __name__, "(cfg: omegaconf.dictconfig.DictConfig)")
