"""docs/install.md's tables are what ``python -m umst_plugin.patches`` prints -- the fixes (``umst_plugin/patches``),
then the features that replace fairseq's code (``umst_plugin/features.py``) -- and every fix and feature says whether
it changes a stock fairseq run's numbers."""
import os

from umst_plugin import features, patches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_install_md_holds_the_generated_table():
    with open(os.path.join(ROOT, "docs", "install.md"), encoding="utf-8") as f:
        text = f.read()
    assert patches.markdown_table() in text, "regenerate it: python -m umst_plugin.patches"
    assert features.markdown_table() in text, "regenerate it: python -m umst_plugin.patches (the second table)"


def test_every_patch_says_whether_it_changes_a_stock_run():
    assert set(patches.STOCK_NUMBERS) == set(patches.PATCHES)
    for name, answer in patches.STOCK_NUMBERS.items():
        assert answer.startswith(("no", "yes")) and ("because" in answer or answer.startswith("no")), name


def test_every_feature_says_whether_it_changes_a_stock_run():
    assert set(features.STOCK_NUMBERS) == set(features.FEATURES)
    for module, answer in features.STOCK_NUMBERS.items():
        assert answer.startswith(("no", "yes")) and ("because" in answer or answer.startswith("no")), module.__name__
        assert module.OPTIONS and module.TARGET and module.SYMPTOM and module.REMOVE_WHEN, module.__name__
