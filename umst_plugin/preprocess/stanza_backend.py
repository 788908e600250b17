"""``--parser stanza``: a stanza Pipeline on the words rebuilt from the BPE text.

``tokenize_pretokenized=True`` makes stanza take our words as they are, one
sentence per input line, never split or merged; the processors are tokenize,
pos, lemma and depparse (add ``mwt`` with ``--stanza-processors`` for languages
whose multi-word tokens stanza expands, e.g. de ``zum`` = ``zu dem``: the
surface token then takes the head and label of its syntactic head word).

The backend is two separable steps so the second is testable without a model:
``self.pipeline(list of word lists) -> stanza Document`` (the model), and
``parses_from_document(document, sentences)`` (our conversion and checks).
"""
import os
import shlex
import sys

from umst_plugin.preprocess.conllu_reader import SurfaceParse, collapse_multiword
from umst_plugin.preprocess.errors import ParserSetupError
from umst_plugin.preprocess.parser_base import ParserBackend, register_backend

DEFAULT_PROCESSORS = "tokenize,pos,lemma,depparse"


def default_stanza_dir():
    return os.environ.get("STANZA_RESOURCES_DIR") or os.path.join(os.path.expanduser("~"), "stanza_resources")


def download_command(lang, model_dir, processors, package="default"):
    """The one shell command that fetches what the pipeline needs, with this interpreter (the environment stanza is
    installed in: a bare ``python`` may be another one)."""
    pkg = "" if package == "default" else f", package='{package}'"
    return (f"{shlex.quote(sys.executable)} -c \"import stanza; stanza.download('{lang}', model_dir='{model_dir}', "
            f"processors='{processors}'{pkg})\"")


def resolve_device(device):
    """'auto' -> 'cuda' when torch sees a GPU, else 'cpu'."""
    if device and device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parses_from_document(document, sentences):
    """One SurfaceParse per input sentence from a stanza Document.

    Raises ValueError when the Document does not line up with ``sentences``
    (sentence count, token count or token text), so a misaligned parse is never
    written; ``safe_parse`` turns that into fallbacks sentence by sentence.
    """
    if len(document.sentences) != len(sentences):
        raise ValueError(f"stanza returned {len(document.sentences)} sentences for {len(sentences)} input lines; "
                         "expected one per line (is tokenize_pretokenized on?)")
    parses = []
    for k, (sent, words) in enumerate(zip(document.sentences, sentences)):
        tokens = sent.tokens
        if len(tokens) != len(words):
            raise ValueError(f"sentence {k + 1}: stanza has {len(tokens)} tokens for {len(words)} words")
        groups = []
        for tok, word in zip(tokens, words):
            if tok.text != word:
                raise ValueError(f"sentence {k + 1}: stanza token {tok.text!r} for word {word!r}")
            groups.append([(w.id, w.head, w.deprel) for w in tok.words])
        if any(h is None for g in groups for _, h, _ in g):
            raise ValueError(f"sentence {k + 1}: the stanza Document has no heads (is depparse in the processors?)")
        heads, labels = collapse_multiword(groups)
        parses.append(SurfaceParse(list(words), heads, labels))
    return parses


@register_backend("stanza")
class StanzaBackend(ParserBackend):
    """stanza dependency parser (UD labels), the default ``--parser``."""

    @classmethod
    def add_args(cls, parser):
        g = parser.add_argument_group("stanza parser (--parser stanza)")
        g.add_argument("--stanza-lang", default=None, help="stanza language code (default: --parser-model, else "
                       "--source-lang)")
        g.add_argument("--stanza-dir", default=None, help="where stanza models live (default: "
                       "$STANZA_RESOURCES_DIR, else ~/stanza_resources)")
        g.add_argument("--stanza-package", default="default", help="stanza model package (default: default)")
        g.add_argument("--stanza-processors", default=DEFAULT_PROCESSORS,
                       help=f"stanza processors (default: {DEFAULT_PROCESSORS}; add mwt for languages with "
                       "multi-word tokens)")

    def __init__(self, args=None, pipeline=None):
        """``pipeline``: a callable taking a list of word lists and returning a stanza
        Document, in place of building a stanza Pipeline (how tests run the conversion
        on Documents made without a model)."""
        self.lang = (getattr(args, "stanza_lang", None) or getattr(args, "parser_model", None)
                     or getattr(args, "source_lang", None) or "en")
        self.pipeline = pipeline if pipeline is not None else self.build_pipeline(args)

    def build_pipeline(self, args):
        try:
            import stanza
            from stanza.pipeline.core import LanguageNotDownloadedError, UnsupportedProcessorError
            from stanza.resources.common import ResourcesFileNotFoundError, UnknownLanguageError
        except ImportError:
            raise ParserSetupError("--parser stanza needs the stanza package: pip install 'stanza>=1.5' "
                                   "(or pip install 'umst-plugin[stanza]')") from None
        model_dir = getattr(args, "stanza_dir", None) or default_stanza_dir()
        processors = getattr(args, "stanza_processors", None) or DEFAULT_PROCESSORS
        package = getattr(args, "stanza_package", None) or "default"
        device = resolve_device(getattr(args, "device", "auto"))
        batch_tokens = getattr(args, "batch_tokens", None) or 5000
        try:
            return stanza.Pipeline(
                self.lang, dir=model_dir, package=package, processors=processors, tokenize_pretokenized=True,
                download_method=None, device=device, use_gpu=device != "cpu", logging_level="WARN",
                pos_batch_size=batch_tokens, depparse_batch_size=batch_tokens, lemma_batch_size=batch_tokens)
        except (ResourcesFileNotFoundError, LanguageNotDownloadedError, UnsupportedProcessorError,
                FileNotFoundError) as e:
            raise ParserSetupError(
                f"stanza model for language {self.lang!r} (processors {processors}) not found in {model_dir} "
                f"({e}). Download it once with:\n  {download_command(self.lang, model_dir, processors, package)}"
            ) from None
        except UnknownLanguageError as e:
            raise ParserSetupError(f"stanza does not know language {self.lang!r} ({e}); set --stanza-lang "
                                   "to a stanza language code") from None

    def parse(self, sentences):
        document = self.pipeline([list(words) for words in sentences])
        return parses_from_document(document, sentences)
