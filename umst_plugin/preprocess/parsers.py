"""Dependency-parser backends behind one interface.

A backend turns sentences (lists of words, Moses escapes already undone) into
one ``SurfaceParse`` per sentence with exactly as many heads as words. Backends
register here by name; ``umst-preprocess --parser NAME`` and the task's
``--source-parser NAME`` (for fairseq-interactive, which builds them with
``build_backend(name, Namespace(parser_model=...))``) pick one.

* ``stanza`` (``stanza_backend``): a stanza Pipeline on pre-tokenized words;
* ``spacy`` (``spacy_backend``): any installed spaCy pipeline with a parser;
* ``none``: the fallback graph for every sentence;
* ``conllu`` is file-based (parses made elsewhere) and handled by the CLI.

Fallback graph: a sentence without a parse gets every word's head = 0 (no
dependency edges) and label ``_``. UMST's phrase GCN then sees only self loops,
i.e. each word is its own phrase; nothing about the sentence is invented.
``safe_parse`` gives it to every sentence a backend cannot parse (no words, an
empty word, more than ``max_words`` words, an exception, an output that does not
line up with the input) and records why, so a multi-hour run never dies on one
bad line and the counts are reported at the end.
"""
import logging

from umst_plugin.preprocess import spacy_backend, stanza_backend  # noqa: F401  (they register on import)
from umst_plugin.preprocess.parser_base import (BACKENDS, FALLBACK_LABEL, ParserBackend,  # noqa: F401  (API)
                                                fallback_parse, register_backend)

logger = logging.getLogger("umst_plugin.preprocess")

@register_backend("none")
class NoParser(ParserBackend):
    """Every sentence gets the fallback graph (no dependency edges)."""

    def parse(self, sentences):
        return [fallback_parse(words) for words in sentences]


def build_backend(name, args=None):
    if name not in BACKENDS:
        raise ValueError(f"unknown parser {name!r}; available: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name](args)


def _check_parse(parse, words):
    """Why ``parse`` cannot be used for ``words`` (None if it can)."""
    n = len(words)
    if len(parse.heads) != n or len(parse.labels) != n:
        return f"misaligned ({len(parse.heads)} heads and {len(parse.labels)} labels for {n} words)"
    if any(not (0 <= h <= n) or h == k + 1 for k, h in enumerate(parse.heads)):
        return "head out of range"
    return None


def safe_parse(backend, sentences, max_words=0):
    """Parse a batch; every sentence the backend fails on gets the fallback graph.

    Returns one SurfaceParse per sentence; ``parse.fallback`` names the reason
    (``"empty"``, ``"too long"``, ``"error: ..."``, ``"misaligned ..."``) or is
    None for a real parse. A batch that raises is retried sentence by sentence,
    so one bad sentence costs only itself.
    """
    out = [None] * len(sentences)
    todo = []
    for k, words in enumerate(sentences):
        if not words or any(not w or w.isspace() for w in words):
            out[k] = fallback_parse(words, "empty")
        elif max_words and len(words) > max_words:
            out[k] = fallback_parse(words, "too long")
        else:
            todo.append(k)

    def run(indices):
        batch = [sentences[k] for k in indices]
        try:
            parses = list(backend.parse(batch))
            if len(parses) != len(batch):
                raise RuntimeError(f"{len(parses)} parses for {len(batch)} sentences")
        except Exception as e:  # a parser bug must not kill a multi-hour run; isolate the sentence
            if len(indices) > 1:
                for k in indices:
                    run([k])
                return
            logger.warning(f"parser {backend.name!r} failed on a sentence of {len(batch[0])} words "
                           f"({type(e).__name__}: {e}); using the fallback graph")
            out[indices[0]] = fallback_parse(batch[0], f"error: {type(e).__name__}")
            return
        for k, parse in zip(indices, parses):
            problem = _check_parse(parse, sentences[k])
            out[k] = parse if problem is None else fallback_parse(sentences[k], problem)

    if todo:
        run(todo)
    return out
