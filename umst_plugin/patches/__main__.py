"""``python -m umst_plugin.patches``: the tables of what the plugin changes in fairseq and torch: its fixes, then its
features (``umst_plugin/features.py``)."""
from umst_plugin import features, patches

print(patches.markdown_table())
print()
print(features.markdown_table())
