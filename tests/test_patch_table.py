"""docs/install.md's patch table is what ``python -m umst_plugin.patches`` prints, and every patch says whether it
changes a stock fairseq run's numbers."""
import os

from umst_plugin import patches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_install_md_holds_the_generated_table():
    with open(os.path.join(ROOT, "docs", "install.md"), encoding="utf-8") as f:
        assert patches.markdown_table() in f.read(), "regenerate it: python -m umst_plugin.patches"


def test_every_patch_says_whether_it_changes_a_stock_run():
    assert set(patches.STOCK_NUMBERS) == set(patches.PATCHES)
    for name, answer in patches.STOCK_NUMBERS.items():
        assert answer.startswith(("no", "yes")) and ("because" in answer or answer.startswith("no")), name
