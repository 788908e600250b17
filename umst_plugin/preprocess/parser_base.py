"""The parser-backend interface and its registry (no backend imported here: the backends import this module,
``preprocess.parsers`` imports the backends; no import circle)."""
from umst_plugin.preprocess.conllu_reader import SurfaceParse

BACKENDS = {}

FALLBACK_LABEL = "_"


def register_backend(name):
    def wrap(cls):
        if name in BACKENDS:
            raise ValueError(f"parser backend {name!r} registered twice")
        BACKENDS[name] = cls
        cls.name = name
        return cls
    return wrap


def fallback_parse(words, reason=None):
    return SurfaceParse(list(words), [0] * len(words), [FALLBACK_LABEL] * len(words), fallback=reason)


class ParserBackend:
    """Base class: ``parse(list of word lists) -> list of SurfaceParse``.

    ``parse`` may raise on a bad sentence; ``safe_parse`` isolates it. Backends
    read their options from the argparse Namespace given to the constructor with
    ``getattr(args, name, default)``, so a Namespace holding only ``parser_model``
    (what the task passes) is enough.
    """

    name = None

    def __init__(self, args=None):
        pass

    @classmethod
    def add_args(cls, parser):
        pass

    def parse(self, sentences):
        raise NotImplementedError
