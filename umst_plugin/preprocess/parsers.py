"""Dependency-parser backends behind one interface.

A backend turns sentences (lists of words, Moses escapes already undone) into
one ``SurfaceParse`` per sentence with exactly as many heads as words. Backends
register here by name; ``umst-preprocess --parser NAME`` and the task's
``--source-parser NAME`` (for fairseq-interactive) pick one.

``conllu`` is file-based (parses made elsewhere, read in order); ``none`` gives
the fallback graph described below. Model-based backends (stanza, spaCy) plug
in through ``register_backend``.

Fallback graph: a sentence without a parse gets every word's head = 0 (no
dependency edges). UMST's phrase GCN then sees only self loops, i.e. each word
is its own phrase; nothing about the sentence is invented.
"""
from umst_plugin.preprocess.conllu_reader import SurfaceParse

BACKENDS = {}


def register_backend(name):
    def wrap(cls):
        if name in BACKENDS:
            raise ValueError(f"parser backend {name!r} registered twice")
        BACKENDS[name] = cls
        cls.name = name
        return cls
    return wrap


def fallback_parse(words):
    return SurfaceParse(list(words), [0] * len(words), ["_"] * len(words))


class ParserBackend:
    """Base class: ``parse(list of word lists) -> list of SurfaceParse``."""

    name = None

    @classmethod
    def add_args(cls, parser):
        pass

    def parse(self, sentences):
        raise NotImplementedError


@register_backend("none")
class NoParser(ParserBackend):
    """Every sentence gets the fallback graph (no dependency edges)."""

    def __init__(self, args=None):
        pass

    def parse(self, sentences):
        return [fallback_parse(words) for words in sentences]


def build_backend(name, args=None):
    if name not in BACKENDS:
        raise ValueError(f"unknown parser {name!r}; available: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name](args)
