class SideDataError(ValueError):
    """Input that cannot be turned into aligned side data.

    The message always names the file, the 1-based line (or sentence) number
    and what was expected, e.g. ``train.bpe.en:17: 12 words in the BPE text but
    11 tokens in train.en.conllu (sentence 17, starting at line 203)``.
    """

    def __init__(self, path, line, message):
        self.path, self.line = path, line
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {message}")
