"""Reading BPE text safely and turning it back into parser-readable words."""
from umst_plugin.data.word_boundaries import word_ids_from_pieces, words_from_pieces
from umst_plugin.preprocess.errors import SideDataError

# Moses escapes written by the standard WMT tokenization (sacremoses/tokenizer.perl).
MOSES_ESCAPES = {
    "&apos;": "'", "&quot;": '"', "&amp;": "&", "&#124;": "|",
    "&lt;": "<", "&gt;": ">", "&#91;": "[", "&#93;": "]",
}


def moses_unescape(word):
    if "&" not in word:
        return word
    for escaped, plain in MOSES_ESCAPES.items():
        word = word.replace(escaped, plain)
    return word


def read_bpe_lines(path):
    """Yield (line_number, pieces) for every line of a BPE file.

    Decoding happens line by line so that a bad byte is reported with its line;
    an empty line is an error because it has no word to attach a parse to.
    """
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SideDataError(path, number, f"not valid UTF-8 ({e.reason} at byte {e.start}); "
                                    "expected UTF-8 text, one sentence per line") from None
            pieces = line.split()
            if not pieces:
                raise SideDataError(path, number, "empty line; expected at least one token "
                                    "(remove empty sentence pairs before preprocessing)")
            yield number, pieces


def parser_words(pieces, scheme):
    """Words for a dependency parser: markers removed, Moses escapes undone."""
    return [moses_unescape(w) for w in words_from_pieces(pieces, scheme)]


__all__ = ["moses_unescape", "read_bpe_lines", "parser_words", "word_ids_from_pieces", "words_from_pieces"]
