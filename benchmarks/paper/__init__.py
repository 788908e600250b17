"""Each family's paper table: ``benchmarks/paper/<family>.py`` (``python -m benchmarks paper <family>``).

A family's table may also define models of the family's shape that only benchmarks build (``SHAPE_ROWS``: row name
-> dict(arch, overrides, quick, label, floor_of: the rows whose floor it is, register: registers the model in the
process)); :func:`shape_rows` collects them for the benchmarks that count a shape's floor (``launches --floor``).
"""
import importlib
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def tables():
    """The family names that have a paper table here."""
    return sorted(n[:-3] for n in os.listdir(HERE) if n.endswith(".py") and not n.startswith("_"))


def _with(attribute):
    """The paper tables (modules) that define ``attribute``, in the families' registry order."""
    from umst_plugin import families

    modules = [importlib.import_module(f"{__name__}.{f.name}") for f in families.all_families() if f.name in tables()]
    return [m for m in modules if hasattr(m, attribute)]


def decode_claim():
    """A paper's decoding-speed claim that ``python -m benchmarks decode`` measures (a table's ``DECODE_CLAIM``:
    dict(rows: row name -> (arch, overrides), summary: the claim's JSON from the rows' results, line: its
    markdown line)), or None."""
    found = _with("DECODE_CLAIM")
    return found[0].DECODE_CLAIM if found else None


def shape_rows():
    """Every paper table's ``SHAPE_ROWS``, in the families' registry order."""
    rows = {}
    for module in _with("SHAPE_ROWS"):
        rows.update(module.SHAPE_ROWS)
    return rows
