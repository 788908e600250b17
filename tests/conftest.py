import pytest
import torch

# Two cores shared by two xdist workers: one intra-op thread each.
torch.set_num_threads(1)


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device; skipped when none is present")
    config.addinivalue_line("markers", "slow: end-to-end CLI runs (seconds to a minute each)")


def pytest_collection_modifyitems(config, items):
    longest_files_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def longest_files_first(items):
    """The test files in the order of their measured seconds (tests/file_seconds.json), longest first, each file's
    tests together and in their own order; files without a record after them, as collected. scripts/test.sh's
    workers take whole files in this order (tests/file_seconds.py says why)."""
    import file_seconds

    seconds = file_seconds.load()
    first = {}
    for i, item in enumerate(items):
        first.setdefault(item.path.name, i)
    items.sort(key=lambda item: (-seconds.get(item.path.name, 0.0), first[item.path.name]))  # (a stable sort)


@pytest.fixture(scope="session")
def toy_raw(tmp_path_factory):
    """The toy corpus (small) with gold CoNLL-U and joint BPE."""
    import e2e

    return e2e.make_toy_corpus(str(tmp_path_factory.mktemp("toy_raw")))


@pytest.fixture(scope="session")
def toy_databin(toy_raw, tmp_path_factory):
    """fairseq-preprocess + umst-preprocess output for the toy corpus."""
    import e2e

    return e2e.binarize(toy_raw, str(tmp_path_factory.mktemp("toy_databin")))
