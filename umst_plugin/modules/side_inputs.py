"""Check that a model which needs source side data actually got it."""


def require_side_inputs(model_name, src_word_ids=None, src_word_heads=None, need_heads=True):
    missing = [name for name, value, needed in (("src_word_ids", src_word_ids, True),
                                                 ("src_word_heads", src_word_heads, need_heads))
               if needed and value is None]
    if missing:
        raise ValueError(
            f"{model_name} needs {' and '.join(missing)} in net_input, which only the multiscale_translation "
            "task provides: train/generate with --task multiscale_translation --user-dir umst_plugin on a "
            "data-bin prepared with umst-preprocess (fairseq-interactive derives them from the tokens; add "
            "--source-parser to parse its input).")
