"""Word boundaries from subword markers.

Two conventions are supported:

* ``subword-nmt``: a piece that continues into the next one ends with ``@@``
  (``the new@@ est car`` -> words ``the``, ``newest``, ``car``).
* ``sentencepiece``: a piece that starts a word begins with ``▁``
  (``▁the ▁new est ▁car``). The first piece of a line always starts a word.

Word ids are 1-based; the same rule is used for text (preprocessing) and for
token tensors (the task at inference time), so both agree by construction.
"""
import torch

SUBWORD_NMT = "subword-nmt"
SENTENCEPIECE = "sentencepiece"
SCHEMES = (SUBWORD_NMT, SENTENCEPIECE)
SP_MARK = "\u2581"


def marker_counts(symbols):
    """(pieces that continue into the next, ``x@@``; pieces that start a word, ``▁x``) among ``symbols``. A bare
    ``@@`` is not counted: it joins the next piece, but it is also a plain symbol of a sentencepiece vocabulary."""
    continues = sum(1 for sym in symbols if len(sym) > 2 and sym.endswith("@@"))
    begins = sum(1 for sym in symbols if sym.startswith(SP_MARK))
    return continues, begins


def detect_scheme(symbols):
    """Guess the marker scheme from a vocabulary or from pieces of text: sentencepiece where more pieces start
    with ``▁`` than end with ``@@``, else subword-nmt (also where neither marker occurs, which reads every piece as
    a word). A count rather than the first ``▁``: subword-nmt text can hold a stray ``▁`` (a sentence that went
    through sentencepiece elsewhere), and reading it as sentencepiece would join all of its words into one.
    TranSFormer's character table (``CharTable``, style ``auto``) detects its style by this rule too."""
    continues, begins = marker_counts(symbols)
    return SENTENCEPIECE if begins > continues else SUBWORD_NMT


def starts_word(piece, previous, scheme):
    """Whether ``piece`` starts a new word given the piece before it (None at line start)."""
    if previous is None:
        return True
    if scheme == SUBWORD_NMT:
        return not previous.endswith("@@")
    return piece.startswith(SP_MARK)


def word_ids_from_pieces(pieces, scheme=SUBWORD_NMT):
    """1-based word index of every piece."""
    ids, word, prev = [], 0, None
    for piece in pieces:
        if starts_word(piece, prev, scheme):
            word += 1
        ids.append(word)
        prev = piece
    return ids


def words_from_pieces(pieces, scheme=SUBWORD_NMT):
    """Rebuild the words (markers removed) from the pieces."""
    words, prev = [], None
    for piece in pieces:
        if scheme == SUBWORD_NMT:
            text = piece[:-2] if piece.endswith("@@") else piece
        else:
            text = piece[1:] if piece.startswith(SP_MARK) else piece
        if starts_word(piece, prev, scheme):
            words.append(text)
        else:
            words[-1] += text
        prev = piece
    return words


def boundary_table(dictionary, scheme=None):
    """Per dictionary entry: (continues, begins) bool tensors.

    ``continues[i]``: entry i ends with ``@@`` (subword-nmt); ``begins[i]``: entry i
    starts with ``▁`` (sentencepiece). Special symbols (pad, eos, bos, unk) begin
    a word and do not continue, so an ``<unk>`` counts as a word of its own.
    """
    symbols = list(dictionary.symbols)
    scheme = scheme or detect_scheme(symbols)
    if scheme not in SCHEMES:
        raise ValueError(f"unknown subword scheme {scheme!r}; expected one of {SCHEMES}")
    n_special = getattr(dictionary, "nspecial", 4)
    continues = torch.zeros(len(symbols), dtype=torch.bool)
    begins = torch.ones(len(symbols), dtype=torch.bool)
    for i, sym in enumerate(symbols):
        if i < n_special:
            continue
        if scheme == SUBWORD_NMT:
            continues[i] = sym.endswith("@@")
        else:
            begins[i] = sym.startswith(SP_MARK)
    return scheme, continues, begins


def word_ids_from_tokens(src_tokens, pad_idx, eos_idx, continues, begins, scheme):
    """Vectorised word ids for a padded token batch (B x T), left or right padded.

    Returns a LongTensor like ``src_tokens``: 0 at padding, else the 1-based word
    index; ``</s>`` is always a word of its own.
    """
    continues = continues.to(src_tokens.device)
    begins = begins.to(src_tokens.device)
    is_tok = src_tokens.ne(pad_idx)
    is_eos = src_tokens.eq(eos_idx)
    if scheme == SUBWORD_NMT:
        prev_cont = torch.zeros_like(is_tok)
        prev_cont[:, 1:] = continues[src_tokens[:, :-1]] & is_tok[:, :-1]
        new_word = ~prev_cont
    else:
        new_word = begins[src_tokens].clone()
        # the first real token of each row starts a word whatever its marker
        first = is_tok & ~torch.cat([torch.zeros_like(is_tok[:, :1]), is_tok[:, :-1]], dim=1)
        new_word |= first
    new_word = (new_word | is_eos) & is_tok
    return torch.cumsum(new_word.long(), dim=1) * is_tok.long()


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
