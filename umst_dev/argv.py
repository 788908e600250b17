"""Model arguments as a dict (fairseq ``args`` names) -> the command-line flags fairseq parses them from.

Imports nothing of the plugin or fairseq: a benchmark's stock-fairseq process and a parent without fairseq use it.
"""


def overrides_to_argv(overrides):
    """``{"encoder_layers": 2, "share_all_embeddings": True, "x": False}`` -> ``["--encoder-layers", "2",
    "--share-all-embeddings"]``: True is the bare flag, False and None leave the flag out."""
    argv = []
    for key, value in (overrides or {}).items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        else:
            argv += [flag, str(value)]
    return argv
