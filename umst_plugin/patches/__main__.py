"""``python -m umst_plugin.patches``: the table of what the plugin changes in fairseq and torch."""
from umst_plugin.patches import markdown_table

print(markdown_table())
