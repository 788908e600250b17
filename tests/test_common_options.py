"""umst_plugin/common_options.py piece by piece: how the plugin's common options (``--amp-dtype``,
``--no-amp-weight-cache``, ``--compile`` and its kin, ``--tf32``, ``--stop-on-signals``) join fairseq's
``CommonConfig`` and every parser. What the options do is tested with each (test_precision_flags.py,
test_compile.py, test_preemption.py); here, where they land, what a parser built before the plugin gets, and what
is refused."""
import argparse
import dataclasses

import pytest
from fairseq.dataclass import FairseqDataclass
from fairseq.dataclass.configs import CommonConfig, FairseqConfig

import umst_plugin  # noqa: F401  (installs the patches)
from umst_plugin import common_options
from umst_plugin.patches import PatchError
from umst_plugin.training.amp_dtype_flag import _AmpDtypeField

AMP_OPTIONS = ("--amp-dtype", "--no-amp-weight-cache")


def test_the_added_fields_follow_the_field_they_were_put_after_in_the_order_added():
    names = list(CommonConfig.__dataclass_fields__)
    at = names.index("amp_scale_window")
    # amp_dtype_flag's two after amp_scale_window, then compilation.flags' four after those (also "after"
    # amp_scale_window); preemption's stop_on_signals names no field: at the end
    assert names[at + 1:at + 7] == ["amp_dtype", "no_amp_weight_cache", "compile", "compile_cudagraphs",
                                    "compile_cudagraph_shapes", "tf32"]
    assert names[-1] == "stop_on_signals"
    assert CommonConfig.__annotations__["amp_dtype"] == _AmpDtypeField.__dataclass_fields__["amp_dtype"].type
    assert CommonConfig.amp_dtype is None and CommonConfig.no_amp_weight_cache is False  # class defaults


def test_commonconfig_takes_the_added_fields_as_keywords_and_defaults_the_rest():
    cfg = CommonConfig(amp=True, amp_dtype="bfloat16")
    assert cfg.amp is True and cfg.amp_dtype == "bfloat16" and cfg.no_amp_weight_cache is False
    assert cfg.compile is False and cfg.tf32 is False
    plain = CommonConfig()
    assert plain.amp_dtype is None and plain.amp is False


def _parser(*options):
    parser = argparse.ArgumentParser()
    for option in options:
        parser.add_argument(option)
    return parser


def test_a_parser_without_the_options_gets_them_all():
    parser = _parser("--amp")
    common_options.add_missing_arguments(parser)
    for name in common_options._ADDED:
        assert common_options._option(name) in parser._option_string_actions, name
    args = parser.parse_args(["--amp-dtype", "bfloat16", "--no-amp-weight-cache", "--stop-on-signals", "SIGUSR1"])
    assert args.amp_dtype == "bfloat16" and args.no_amp_weight_cache is True and args.stop_on_signals == "SIGUSR1"


def test_a_parser_with_some_of_a_groups_options_gets_the_others_one_by_one():
    """A group already half there (a program that added ``--amp-dtype`` itself): the other option of the group is
    added, and ``--amp-dtype`` stays the program's own."""
    parser = _parser("--amp-dtype")
    common_options.add_missing_arguments(parser)
    assert all(o in parser._option_string_actions for o in AMP_OPTIONS + ("--compile", "--tf32"))
    assert parser.parse_args(["--no-amp-weight-cache"]).no_amp_weight_cache is True
    parser = _parser("--no-amp-weight-cache")
    common_options.add_missing_arguments(parser)
    assert parser.parse_args(["--amp-dtype", "bfloat16"]).amp_dtype == "bfloat16"
    # a parser with everything is left as it is
    before = dict(parser._option_string_actions)
    common_options.add_missing_arguments(parser)
    assert parser._option_string_actions == before


class _StaticTask:
    @staticmethod
    def add_args(parser):
        parser.add_argument("--own-static")


class _ClassTask:
    @classmethod
    def add_args(cls, parser):
        parser.add_argument("--own-" + cls.__name__.lower().strip("_"))


class _PlainTask:
    def add_args(self, parser):  # neither: fairseq calls add_args on the class
        pass


class _NoAddArgs(_StaticTask):
    pass


@pytest.mark.parametrize("task_cls, own", [(_StaticTask, "--own-static"), (_ClassTask, "--own-classtask")])
def test_a_tasks_own_add_args_adds_the_missing_options_after_its_own(task_cls, own):
    common_options._wrap_add_args(task_cls)
    assert isinstance(task_cls.__dict__["add_args"], staticmethod if task_cls is _StaticTask else classmethod)
    parser = argparse.ArgumentParser()
    task_cls.add_args(parser)
    assert own in parser._option_string_actions
    assert all(o in parser._option_string_actions for o in AMP_OPTIONS)


def test_add_args_is_left_alone_where_the_task_has_none_and_refused_where_it_is_a_plain_method():
    inherited = _NoAddArgs.__dict__.get("add_args")
    common_options._wrap_add_args(_NoAddArgs)
    assert _NoAddArgs.__dict__.get("add_args") is inherited is None
    with pytest.raises(PatchError, match="_PlainTask.add_args is neither a classmethod nor a staticmethod"):
        common_options._wrap_add_args(_PlainTask)


def test_a_fairseq_the_plugin_does_not_know_is_refused():
    @dataclasses.dataclass
    class NoAmp:
        fp16: bool = False

    @dataclasses.dataclass
    class Config:
        common: CommonConfig = CommonConfig

    for common_config in (object, NoAmp):
        with pytest.raises(PatchError, match="not a dataclass with an 'amp' field"):
            common_options._check_target(common_config, FairseqConfig, "p")
    with pytest.raises(PatchError, match="FairseqConfig.common is not built from CommonConfig"):
        common_options._check_target(CommonConfig, type("Other", (), {"__dataclass_fields__": {
            "common": dataclasses.field(default=NoAmp)}}), "p")
    common_options._check_target(CommonConfig, FairseqConfig, "p")  # fairseq's own: no error


def test_a_field_fairseq_has_or_one_without_a_default_is_refused():
    @dataclasses.dataclass
    class Foreign(FairseqDataclass):
        amp: bool = False  # fairseq's own --amp

    with pytest.raises(PatchError, match=r"already has \['amp'\]"):
        common_options.add_fields("p", Foreign)

    @dataclasses.dataclass
    class NoDefault:
        umst_test_without_default: int

    with pytest.raises(PatchError, match="'umst_test_without_default' needs a plain default"):
        common_options.add_fields("p", NoDefault)
    assert "umst_test_without_default" not in CommonConfig.__dataclass_fields__


def test_adding_a_group_again_changes_nothing():
    before = list(CommonConfig.__dataclass_fields__), dict(common_options._ADDED)
    common_options.add_fields("umst_plugin.training.amp_dtype_flag", _AmpDtypeField, after="amp_scale_window")
    assert (list(CommonConfig.__dataclass_fields__), dict(common_options._ADDED)) == before


def test_a_group_put_after_the_last_field_or_a_field_fairseq_lacks_goes_at_the_end():
    """In a fresh interpreter (the fields added stay for the process): a group put after ``stop_on_signals``, the
    last field, and one put after a field no fairseq has, each land at the end, and parse and build as the
    others do."""
    import e2e

    code = """
import dataclasses, json
import umst_plugin
from fairseq import options
from fairseq.dataclass import FairseqDataclass
from fairseq.dataclass.configs import CommonConfig
from umst_plugin import common_options

@dataclasses.dataclass
class Last(FairseqDataclass):
    umst_test_last: int = dataclasses.field(default=3, metadata={"help": "a test option"})

@dataclasses.dataclass
class Nowhere(FairseqDataclass):
    umst_test_nowhere: bool = dataclasses.field(default=False, metadata={"help": "a test option"})

common_options.add_fields("test_last", Last, after="stop_on_signals")
common_options.add_fields("test_nowhere", Nowhere, after="no_such_field")
args = options.get_training_parser().parse_args(["--umst-test-last", "5", "--umst-test-nowhere"])
print(json.dumps([list(CommonConfig.__dataclass_fields__)[-3:], args.umst_test_last, args.umst_test_nowhere,
                  CommonConfig(umst_test_last=7).umst_test_last, CommonConfig().umst_test_nowhere]))
"""
    import json

    out = json.loads(e2e.fresh_python(code).splitlines()[-1])
    assert out == [["stop_on_signals", "umst_test_last", "umst_test_nowhere"], 5, True, 7, False]
