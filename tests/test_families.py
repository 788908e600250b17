"""The family registry (umst_plugin/families.py): what registering a family twice, asking for one that is not
registered, and two families naming one benchmark row do. What the five families register is tested by the
harness and house tests; here the registry's own rules, on a family registered for the test and removed after."""
import pytest

import umst_plugin  # noqa: F401  (the five families register)
from umst_plugin import families
from umst_plugin.models.transformer_sf.model import TransformerSlowFastModel as SlowFastModel


@pytest.fixture
def test_family():
    family = families.Family("test_family", "Test", "none", SlowFastModel, object,
                             bench_rows={"test_row": families.BenchRow("transformer_sf_base", "transformer_sf_big")})
    yield family
    families._FAMILIES.pop("test_family", None)


def test_the_five_families_register_in_import_order_with_their_archs():
    names = [f.name for f in families.all_families()]
    assert len(names) == len(set(names)) == 5
    assert families.get("transformer_sf").model is SlowFastModel
    assert "transformer_sf_base" in families.get("transformer_sf").archs
    assert families.archs() == tuple(sorted(families.archs())) and "umst_base" in families.archs()


def test_a_family_registered_again_is_the_same_one_or_refused(test_family):
    assert families.register(test_family) is test_family
    assert families.register(test_family) is test_family  # a package imported again: the same object
    assert families.get("test_family") is test_family and families.all_families()[-1] is test_family
    other = families.Family("test_family", "Other", "none", SlowFastModel, object)
    with pytest.raises(ValueError, match="a family named 'test_family' is registered twice"):
        families.register(other)
    assert families.get("test_family") is test_family


def test_an_unknown_family_is_a_key_error_naming_the_registered_ones():
    with pytest.raises(KeyError, match="no encoder family 'nope'; registered: msc, msmsa, prime, transformer_sf, umst"):
        families.get("nope")


def test_a_benchmark_row_two_families_name_is_refused(test_family):
    families.register(test_family)
    rows = families.bench_rows()
    assert rows["test_row"] is test_family.bench_rows["test_row"] and list(rows)[-1] == "test_row"
    clash = families.Family("test_clash", "Clash", "none", SlowFastModel, object,
                            bench_rows={"test_row": families.BenchRow("a", "b")})
    families.register(clash)
    try:
        with pytest.raises(ValueError, match="benchmark row 'test_row' is registered by two families"):
            families.bench_rows()
    finally:
        families._FAMILIES.pop("test_clash")


def test_registered_families_and_rows_cannot_be_changed_in_place():
    """One registry serves the benchmarks, the Multi30k runner and the tests in a process: a caller that changed a
    row in place (its widths, its baseline) would change it for all of them."""
    import dataclasses

    family = families.get("umst")
    row = next(iter(family.bench_rows.values()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.baseline = "other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        family.title = "other"


def test_a_rows_defaults_are_a_default_table_row_compared_with_the_transformer():
    row = families.BenchRow("a_base", "a_big")
    assert (row.baseline, row.shape_baseline, row.baseline_only, row.extra, row.recipes) == \
        ("transformer", None, False, False, ())
    assert (row.overrides, row.big_overrides, row.quick, row.label) == ({}, {}, {}, "")
