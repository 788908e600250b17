import os

# The suite's compiled code: inductor's C++ without SIMD (before torch reads its config). The tests check the graphs
# dynamo, AOTAutograd and inductor build from the plugin's layers (what compiles, falls back, recompiles, and the
# numbers it computes), not gcc's vector code, whose C++ costs a cold compile 25% more (measured: a TranSFormer
# layer test, 228 s against 172 s on 2 cores) and which a GPU's Triton does not use. Set it in the environment to
# test vector code; subprocesses inherit it.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")
# ... and g++ at -O0, linked by gold (tests/fast_cxx/g++ says why: a third less CPU per kernel file; inductor finds
# the compiler by its name, hence the file's). Set CXX to test another compiler.
SUITE_CXX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fast_cxx", "g++")
CXX_FROM_ENVIRONMENT = "CXX" in os.environ
os.environ.setdefault("CXX", SUITE_CXX)

import pytest  # noqa: E402
import torch  # noqa: E402

# Two cores shared by the xdist workers (three: scripts/test.sh): one intra-op thread each.
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``UMST_TEST_CPU_LOG=FILE``: one JSON line per test with its wall seconds and the CPU seconds of the
    worker (``self``) and of the processes it started and waited for (``children``: g++ under inductor, the CLIs
    the test runs). The suite is bound by CPU on 2 cores, so its slow parts are the CPU-heavy tests, which wall
    times inflated by the other workers do not show (``python tests/file_seconds.py --cpu FILE`` sums them)."""
    log = os.environ.get("UMST_TEST_CPU_LOG")
    if not log:
        yield
        return
    import json
    import resource
    import time

    def cpu(who):
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime

    start, own, children = time.time(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    yield
    record = dict(test=item.nodeid, wall=round(time.time() - start, 2), self=round(cpu(resource.RUSAGE_SELF) - own, 2),
                  children=round(cpu(resource.RUSAGE_CHILDREN) - children, 2))
    with open(log, "a") as f:  # (one short append per line: the workers' lines do not interleave)
        f.write(json.dumps(record) + "\n")


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


def built_once(tmp_path_factory, worker_id, name, build):
    """``build(directory)``'s result, built by one xdist worker of this run and reused by the other (pytest-xdist's
    documented pattern: a file lock in the run's base directory, which the workers share); each its own without
    xdist."""
    if worker_id == "master":
        return build(str(tmp_path_factory.mktemp(name)))
    from filelock import FileLock

    directory = tmp_path_factory.getbasetemp().parent / name
    done = directory.with_name(name + ".done")
    with FileLock(str(directory) + ".lock"):
        if not done.exists():
            directory.mkdir(exist_ok=True)  # (left by a build that failed: built again)
            result = build(str(directory))
            assert result == str(directory), (result, directory)
            done.touch()
    return str(directory)


@pytest.fixture(scope="session")
def toy_raw(tmp_path_factory, worker_id):
    """The toy corpus (small) with gold CoNLL-U and joint BPE."""
    import e2e

    return built_once(tmp_path_factory, worker_id, "toy_raw", e2e.make_toy_corpus)


@pytest.fixture(scope="session")
def toy_databin(toy_raw, tmp_path_factory, worker_id):
    """fairseq-preprocess + umst-preprocess output for the toy corpus."""
    import e2e

    return built_once(tmp_path_factory, worker_id, "toy_databin", lambda d: e2e.binarize(toy_raw, d))


@pytest.fixture(scope="session")
def multi30k_standin(tmp_path_factory, worker_id):
    """scripts/prepare-multi30k.sh on the first lines of the Multi30k raw files (the toy corpus under their names
    where ../shared is absent), spaCy parser: the dict of tests/recipe_toy.py's ``multi30k_standin``. Read-only:
    a test that changes it works on a copy."""
    pytest.importorskip("spacy")
    import recipe_toy

    top = built_once(tmp_path_factory, worker_id, "multi30k_standin", recipe_toy.prepare_multi30k_standin)
    return recipe_toy.multi30k_standin(top)


@pytest.fixture
def float64_softmax(monkeypatch):
    """fairseq's attention takes its softmax in float32 for any input (``utils.softmax``): in float64 comparisons it
    keeps float64 (half inputs still go to float32)."""
    import torch.nn.functional as F
    from fairseq.modules import multihead_attention

    def softmax(x, dim, onnx_trace=False):
        return F.softmax(x, dim=dim, dtype=torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else None)

    monkeypatch.setattr(multihead_attention.utils, "softmax", softmax)


@pytest.fixture
def clean_process_record():
    """Tests that go through a CLI entry in-process leave this process's --amp record as they found it."""
    from umst_plugin import mixed_precision

    saved = mixed_precision._process_amp, mixed_precision._process_amp_dtype
    yield
    mixed_precision._process_amp, mixed_precision._process_amp_dtype = saved
