"""CoNLL-U parses as (heads, labels) per surface token.

Multi-word token ranges (``2-3 du`` over ``2 de``, ``3 le``) collapse onto
their surface token, since the BPE text holds the surface form: the token's
head is the head of the range's syntactic head word (the word whose head lies
outside the range) mapped to surface indices, and its label is that word's.
Empty nodes (``8.1``) are enhanced-graph artefacts and are ignored.
"""
import conllu

from umst_plugin.preprocess.errors import SideDataError


class SurfaceParse:
    """One sentence's parse over its surface words: 1-based heads (0 = root) and labels.

    ``fallback`` is None for a real parse, else why the sentence got the
    fallback graph (see ``parsers.safe_parse``).
    """

    __slots__ = ("forms", "heads", "labels", "fallback")

    def __init__(self, forms, heads, labels, fallback=None):
        self.forms, self.heads, self.labels, self.fallback = forms, heads, labels, fallback


def collapse_multiword(tokens):
    """Surface (heads, labels) from syntactic words grouped by surface token.

    ``tokens``: per surface token, its syntactic words as (word_id, head, label);
    a plain token has one word, a multi-word token (``zum`` = ``zu dem``) several.
    The token takes the head and label of its syntactic head word (the member
    whose head lies outside the token), with heads mapped to surface indices.
    Raises ValueError naming the word whose head is not in the sentence.
    """
    surface_of = {}
    for t, words in enumerate(tokens):
        for wid, _, _ in words:
            surface_of[wid] = t + 1
    heads, labels = [], []
    for words in tokens:
        inside = {wid for wid, _, _ in words}
        wid, head, label = next((w for w in words if w[1] not in inside), words[0])
        if head == 0:
            heads.append(0)
        elif head not in surface_of:
            raise ValueError(f"word {wid} points to head {head}, which is not a word of the sentence")
        else:
            heads.append(surface_of[head])
        labels.append(label or "_")
    return heads, labels


def _collapse(tokenlist, path, start):
    """Surface-token parse of one sentence; errors name the sentence's first line."""
    ranges, words = [], []
    for tok in tokenlist:
        tid = tok["id"]
        if isinstance(tid, tuple):
            if len(tid) == 3 and tid[1] == "-":
                ranges.append((tid[0], tid[2], tok["form"]))
            # ('8', '.', '1') empty nodes are skipped
            continue
        words.append(tok)
    if not words:
        raise SideDataError(path, start, "no word lines; expected at least one")
    surface_of = {}  # syntactic word id -> 0-based surface index
    forms, head_word = [], []
    range_at = {first: (first, end, form) for first, end, form in ranges}
    i = 0
    expected = 1
    while i < len(words):
        wid = words[i]["id"]
        if wid != expected:
            raise SideDataError(path, start, f"word ids not consecutive "
                                f"(found {wid}, expected {expected})")
        if wid in range_at:  # (not ``start``: that is the sentence's first line, which errors name)
            first, end, form = range_at[wid]
            members = words[i:i + end - first + 1]
            for w in members:
                surface_of[w["id"]] = len(forms)
            inside = {w["id"] for w in members}
            head = next((w for w in members if w["head"] not in inside), members[0])
            forms.append(form)
            head_word.append(head)
            i += len(members)
            expected = end + 1
        else:
            surface_of[wid] = len(forms)
            forms.append(words[i]["form"])
            head_word.append(words[i])
            i += 1
            expected += 1
    heads, labels = [], []
    for w in head_word:
        h = w["head"]
        if h is None:  # conllu reads the column as an int or "_" (None); anything else is its ParseException
            raise SideDataError(path, start, f"word {w['id']} has head {h!r}; "
                                "expected an integer (basic dependency tree)")
        if h == 0:
            heads.append(0)
        elif h not in surface_of:
            raise SideDataError(path, start, f"word {w['id']} points to head {h}, "
                                f"but the sentence has {len(words)} words")
        else:
            heads.append(surface_of[h] + 1)
        labels.append(w["deprel"] or "_")
    return SurfaceParse(forms, heads, labels)


def read_conllu(path):
    """Yield a SurfaceParse per sentence, with errors naming the sentence's first line."""
    with open(path, "rb") as f:  # decoded line by line, so that a bad byte's error names its own line
        buffer, start = [], 1
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8").replace("\r\n", "\n")  # Windows line ends, as text mode read them
            except UnicodeDecodeError as e:
                raise SideDataError(path, line_no, f"not valid UTF-8 ({e.reason}); expected UTF-8 CoNLL-U") from None
            if "\r" in line:  # binary lines split only at "\n": a classic-Mac file would read as one line
                raise SideDataError(path, line_no, "carriage return (\\r) inside the line, not as part of a "
                                    "\\r\\n line end; expected \\n or \\r\\n line ends")
            if line.strip():
                if not buffer:
                    start = line_no
                buffer.append(line)
                continue
            if buffer:
                yield _parse_block(path, buffer, start)
                buffer = []
        if buffer:
            yield _parse_block(path, buffer, start)


def _parse_block(path, lines, start):
    for offset, line in enumerate(lines):
        if not line.startswith("#") and line.rstrip("\n").count("\t") != 9:
            raise SideDataError(path, start + offset, f"malformed CoNLL-U line with "
                                f"{line.rstrip(chr(10)).count(chr(9)) + 1} columns; expected 10 tab-separated columns")
    text = "".join(lines)
    try:
        sentences = conllu.parse(text)
    except Exception as e:  # conllu raises ParseException and ValueError subclasses
        raise SideDataError(path, start, f"malformed CoNLL-U sentence: {e}; expected 10 tab-separated "
                            "columns per word line") from None
    if len(sentences) != 1:
        raise SideDataError(path, start, f"expected one sentence in this block, found {len(sentences)}")
    return _collapse(sentences[0], path, start)
