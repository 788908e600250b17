import pytest
import torch

# Two cores shared by two xdist workers: one intra-op thread each.
torch.set_num_threads(1)


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device; skipped when none is present")
    config.addinivalue_line("markers", "slow: end-to-end CLI runs (seconds to a minute each)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


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
