"""The family registry: one entry per encoder family, registered by the family's own package.

A family (UMST, TranSFormer, MSC, MSMSA, Prime) registers itself once, from its own model package, with
:func:`register`::

    families.register(families.Family(
        name="prime", title="Prime", paper="Zhao et al. 2019, MUSE: Parallel Multi-Scale Attention ...",
        model=PrimeModel, encoder=PrimeEncoder, layers=(PrimeLayer,), capture=capture_prime,
        bench_rows={"prime": families.BenchRow("prime_base", "prime_big"), ...}))

and everything that used to list the families by name reads this registry instead: compile (the layer classes
are compile regions), ``fairseq-inspect`` (the capture of each family), the benchmarks (one arch table, built from
every family's :class:`BenchRow` s), collect_results and the Multi30k runner (through the rows' configs), the
tests and the offline install (the archs). A sixth encoder touches its own files and this one registration.

The registry names no family: :func:`all_families` imports ``umst_plugin`` (whose models register on import) and
returns what registered, in registration order (the model folders' sorted order).
"""
import importlib
from dataclasses import dataclass, field
from typing import Callable, Optional

_FAMILIES = {}  # name -> Family, filled by register() as the model packages are imported


@dataclass(frozen=True)
class BenchRow:
    """One row of the benchmarks' arch table.

    ``base`` / ``big``: the registered arch at base and big width; ``overrides``: model arguments (the fairseq
    ``args`` names, underscores) at both widths, ``big_overrides`` on top at big width; ``quick``: what a smoke
    run (the harness's tiny widths) needs on top, such as the family's own sizes; ``baseline``: the transformer
    row it is compared with per FLOP; ``shape_baseline``: a transformer row of the family's own shape where it has
    one (Prime's 12+12 narrow layers); ``label``: shown after the row's name; ``baseline_only``: a transformer
    row that only serves as another row's baseline (not one of the family's archs); ``extra``: a row asked for by
    name only, left out of the default table (a trade-off flag's variant); ``recipes``: the configs (``configs/``
    names, base then big) whose model this row is, where a WMT recipe trains the family's arch at another shape
    than its defaults (UMST's MUSE: ``prime_base`` at the transformer's 6+6 layers): the speed table measures such
    a row by default, extra or not, and a test holds it to those configs."""
    base: str
    big: str
    overrides: dict = field(default_factory=dict)
    big_overrides: dict = field(default_factory=dict)
    quick: dict = field(default_factory=dict)
    baseline: str = "transformer"
    shape_baseline: Optional[str] = None
    label: str = ""
    baseline_only: bool = False
    extra: bool = False
    recipes: tuple = ()


@dataclass(frozen=True)
class Family:
    """A family of encoders: its fairseq model, encoder and layer classes, its inspect capture and its benchmark
    rows. ``archs`` are read from fairseq's registry (every arch whose model is ``model``)."""
    name: str
    title: str
    paper: str
    model: type
    encoder: type
    layers: tuple = ()
    capture: Optional[Callable] = None
    bench_rows: dict = field(default_factory=dict)

    @property
    def archs(self):
        from fairseq.models import ARCH_MODEL_REGISTRY

        return tuple(sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m is self.model))


def register(family):
    """Add ``family`` (called once, by the family's model package at import time)."""
    if family.name in _FAMILIES and _FAMILIES[family.name] is not family:
        raise ValueError(f"a family named {family.name!r} is registered twice")
    _FAMILIES[family.name] = family
    return family


def all_families():
    """Every registered family, in registration order (``umst_plugin`` imported first: its models register)."""
    importlib.import_module("umst_plugin")
    return tuple(_FAMILIES.values())


def get(name):
    """The family registered as ``name``; a KeyError naming the registered ones otherwise."""
    families = {f.name: f for f in all_families()}
    if name not in families:
        raise KeyError(f"no encoder family {name!r}; registered: {', '.join(families)}")
    return families[name]


def archs():
    """Every arch the families register, sorted."""
    return tuple(sorted(a for f in all_families() for a in f.archs))


def bench_rows():
    """Every family's benchmark rows, name -> :class:`BenchRow`, in registration order."""
    rows = {}
    for family in all_families():
        for name, row in family.bench_rows.items():
            if name in rows:
                raise ValueError(f"benchmark row {name!r} is registered by two families")
            rows[name] = row
    return rows
