"""umst_plugin.patches.wrap: the one way the plugin replaces a function of fairseq or torch -- the signature checked
first, the replacement marked with its patch (a second install changes nothing, also under another patch's wrapper),
the original kept as ``__wrapped__``."""
import types

import pytest

import umst_plugin  # noqa: F401  (installs the patches)
from umst_plugin import patches


def _target():
    def scale(x, factor=2):
        """The target's own docstring."""
        return x * factor

    class Target:
        def method(self, x):
            return x + 1

        @staticmethod
        def static(parser):
            return [parser]

        @classmethod
        def klass(cls, parser):
            return [cls.__name__, parser]

    return types.SimpleNamespace(scale=scale), Target


def test_wrap_checks_marks_keeps_the_original_and_installs_once():
    module, _ = _target()
    fairseqs = module.scale

    def make(original):
        def scale(x, factor=2):
            return original(x, factor) + 1
        return scale

    with pytest.raises(patches.PatchError, match=r"expected \(x\)"):
        patches.wrap(module, "scale", make, "a_patch", "(x)")
    assert module.scale is fairseqs  # nothing replaced
    replacement = patches.wrap(module, "scale", make, "a_patch", "(x, factor=2)")
    assert module.scale is replacement and module.scale(3) == 7
    assert patches.original(module.scale) is fairseqs and module.scale.__doc__ == "The target's own docstring."
    assert patches.installed(module.scale, "a_patch") and not patches.installed(module.scale, "another")
    assert patches.wrap(module, "scale", make, "a_patch", "(x, factor=2)") is None and module.scale is replacement
    # another patch wraps it since: the first one's install still finds itself under it
    outer = patches.wrap(module, "scale", lambda original: lambda x, factor=2: -original(x, factor), "another",
                         "(x, factor=2)")  # (signature: the original's, through __wrapped__)
    assert patches.wrap(module, "scale", make, "a_patch") is None and module.scale is outer
    assert module.scale(3) == -7 and patches.installed(module.scale, "a_patch")


def test_wrap_keeps_a_method_a_staticmethod_or_a_classmethod_what_it_was():
    _, target = _target()
    patches.wrap(target, "method", lambda original: lambda self, x: 10 * original(self, x), "p", "(self, x)")
    assert target().method(1) == 20
    patches.wrap(target, "static", lambda original: lambda parser: original(parser) + ["added"], "p", "(parser)")
    assert isinstance(target.__dict__["static"], staticmethod) and target.static("P") == ["P", "added"]
    patches.wrap(target, "klass", lambda original: lambda cls, parser: original(cls, parser) + ["added"], "p")
    assert isinstance(target.__dict__["klass"], classmethod) and target.klass("P") == ["Target", "P", "added"]


def test_every_patch_installs_once():
    """Installing every patch again replaces nothing (the plugin installed them on import)."""
    from fairseq.trainer import Trainer
    from fairseq.tasks.fairseq_task import FairseqTask

    def replaced():
        return {name: value for owner in (Trainer, FairseqTask) for name, value in vars(owner).items()
                if patches.MARKER in dir(getattr(value, "__func__", value))}
    before = replaced()
    assert before, "no patch of fairseq's Trainer or FairseqTask found"
    patches.install_all()
    assert replaced() == before


def test_wrap_of_an_inherited_method_replaces_it_on_the_subclass_only():
    """A method the class inherits is found through its base (not in the class's own __dict__) and the replacement
    is set on the class named, so the base keeps its own."""
    _, base = _target()

    class Sub(base):
        pass

    replacement = patches.wrap(Sub, "method", lambda original: lambda self, x: 100 * original(self, x), "p",
                               "(self, x)")
    assert Sub().method(1) == 200 and base().method(1) == 2
    assert patches.original(replacement) is base.__dict__["method"] and "method" in Sub.__dict__


def test_install_all_warns_on_another_fairseq_only(monkeypatch, caplog):
    """Every patch is installed already (import), so install_all only checks the version and changes nothing."""
    import fairseq

    with caplog.at_level("WARNING", logger="umst_plugin.patches"):
        patches.install_all()
    assert not [r for r in caplog.records if "written for fairseq-fixed" in r.getMessage()]
    monkeypatch.setattr(fairseq, "__version__", "0.13.0")
    with caplog.at_level("WARNING", logger="umst_plugin.patches"):
        patches.install_all()
    warned = [r.getMessage() for r in caplog.records if "written for fairseq-fixed" in r.getMessage()]
    assert len(warned) == 1 and "0.12.3.1" in warned[0] and "fairseq 0.13.0" in warned[0]
