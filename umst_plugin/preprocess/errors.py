"""Errors of the preprocessing CLI; ``SideDataError`` is the side-file contract's (``data/side_files.py``)."""
from umst_plugin.data.side_files import SideDataError  # noqa: F401  (re-exported)


class ParserSetupError(RuntimeError):
    """A parser backend cannot start (library or model missing); the message says how to fix it."""
