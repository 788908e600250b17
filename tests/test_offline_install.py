"""scripts/offline-wheelhouse.sh and scripts/offline-install.sh (issue 14, installing with no internet).

The cheap tests need neither the network nor fairseq's 4-minute build: the wheelhouse script's
--dry-run (package list and exact pip commands, nothing downloaded) is checked against setup.py,
and the install script's refusals (no torch, a torch wheel in the folder, another Python version)
all happen before pip runs. The real thing (build a wheelhouse, install it into a fresh venv with
--no-index, one fairseq-train update on the toy corpus) runs only with UMST_TEST_OFFLINE_INSTALL=1.
"""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELHOUSE = os.path.join(ROOT, "scripts", "offline-wheelhouse.sh")
INSTALL = os.path.join(ROOT, "scripts", "offline-install.sh")
TORCH_FAMILY = re.compile(r"^(torch|torchaudio|torchvision|triton|nvidia-.*)$")


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def bash(*args, env=None, timeout=120):
    return subprocess.run(["bash", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def dry_run(*args, tmp_path):
    dest = tmp_path / "never-created"
    proc = bash(WHEELHOUSE, "--dry-run", "--dest", str(dest), *args)
    assert proc.returncode == 0, proc.stderr
    assert not dest.exists(), "--dry-run must not create or download anything"
    out = proc.stdout
    collected = dict(re.findall(r"^  \+ (\S+)==(\S+)$", out, flags=re.M))
    left_out = dict(re.findall(r"^  - (\S+) \(tested with (\S+)\)$", out, flags=re.M))
    commands = re.findall(r"^  (\S*python\S* -m pip .*)$", out, flags=re.M)
    return out, {norm(k): v for k, v in collected.items()}, {norm(k): v for k, v in left_out.items()}, commands


def setup_py_requirements():
    tree = ast.parse(open(os.path.join(ROOT, "setup.py")).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            return [Requirement(ast.literal_eval(elt)) for elt in node.value.elts]
    raise AssertionError("no install_requires in setup.py")


def test_wheelhouse_help():
    proc = bash(WHEELHOUSE, "--help")
    assert proc.returncode == 0
    for opt in ("--dest", "--python-version", "--platform", "--skip-present", "--full", "--dry-run"):
        assert opt in proc.stdout


def test_dry_run_default_is_small_and_has_no_torch(tmp_path):
    out, collected, left_out, commands = dry_run(tmp_path=tmp_path)
    assert not [n for n in list(collected) + list(left_out) if TORCH_FAMILY.match(n)]
    assert not re.search(r"\btorch(==|\b(?![-_]))", " ".join(commands).replace("--no-build-isolation", ""))
    # what the GPU image lacks is collected; what it has is left out
    for name in ("fairseq-fixed", "hydra-core", "omegaconf", "antlr4-python3-runtime", "bitarray", "conllu",
                 "tensorboardx", "cffi", "umst-plugin"):
        assert name in collected, name
    for name in ("numpy", "regex", "sacrebleu", "scikit-learn", "scipy", "protobuf", "cython", "pyyaml"):
        assert name in left_out and name not in collected, name
    binary = [c for c in commands if " download " in c and "--only-binary=:all:" in c]
    assert len(binary) == 1
    for flag in ("--no-deps", "--python-version 3.12", "--implementation cp", "--platform manylinux_2_28_x86_64",
                 "--platform manylinux_2_17_x86_64", "--platform manylinux2014_x86_64"):
        assert flag in binary[0], flag
    # fairseq-fixed only as its source archive, built later on the node
    assert "fairseq-fixed" not in binary[0]
    assert any("--no-binary=fairseq-fixed" in c and "fairseq-fixed==0.12.3.1" in c for c in commands)
    assert any(" wheel --no-deps " in c and "antlr4-python3-runtime==4.9.3" in c for c in commands)
    assert any(" wheel --no-deps " in c and c.rstrip().endswith(ROOT) for c in commands)
    assert "nothing downloaded" in out


def test_dry_run_pins_agree_with_setup_py(tmp_path):
    _, collected, left_out, _ = dry_run("--full", "--python-version", "3.11", tmp_path=tmp_path)
    assert not left_out
    assert not [n for n in collected if TORCH_FAMILY.match(n)]
    for req in setup_py_requirements():
        if req.name == "torch":
            continue
        pinned = collected.get(norm(req.name))
        assert pinned is not None, f"setup.py needs {req}, the wheelhouse does not collect it"
        assert req.specifier.contains(pinned), f"setup.py says {req}, the wheelhouse pins {pinned}"
    assert collected["fairseq-fixed"] == "0.12.3.1"
    # same pins whichever Python / mode
    _, collected312, left312, _ = dry_run(tmp_path=tmp_path)
    assert {**collected312, **left312} == collected


def test_skip_present_option(tmp_path):
    _, collected, left_out, _ = dry_run("--skip-present", "numpy, scipy,scikit-learn", tmp_path=tmp_path)
    assert set(left_out) == {"numpy", "scipy", "scikit-learn"}
    assert "regex" in collected and "sacrebleu" in collected


def test_install_help():
    proc = bash(INSTALL, "--help")
    assert proc.returncode == 0
    for opt in ("--target", "--python", "--no-index", "never installs torch"):
        assert opt.lower() in proc.stdout.lower(), opt


def fake_wheelhouse(path, python_version=None, files=()):
    path.mkdir()
    pv = python_version or "%d.%d" % sys.version_info[:2]
    (path / "MANIFEST.txt").write_text(f"python-version: {pv}\nexpected-present: \n")
    (path / "requirements.txt").write_text("conllu==6.0.0\nfairseq-fixed==0.12.3.1\numst-plugin==0.1.0\n")
    for f in files:
        (path / f).write_bytes(b"")
    return path


def test_install_refuses_without_torch(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    assert subprocess.run([str(py), "-c", "import torch"], capture_output=True).returncode != 0
    before = sorted(os.listdir(venv))
    proc = bash(INSTALL, str(fake_wheelhouse(tmp_path / "wh")), "--python", str(py))
    assert proc.returncode != 0
    assert "cannot import torch" in proc.stderr and "never pulls a second torch" in proc.stderr, proc.stderr
    assert "1/5" not in proc.stdout  # nothing was installed
    assert sorted(os.listdir(venv)) == before


def test_install_refuses_a_torch_wheel_in_the_folder(tmp_path):
    wh = fake_wheelhouse(tmp_path / "wh", files=["torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"])
    proc = bash(INSTALL, str(wh), "--python", sys.executable)
    assert proc.returncode != 0
    assert "torch-family files" in proc.stderr and "torch-2.13.0" in proc.stderr, proc.stderr
    assert "1/5" not in proc.stdout


def test_install_refuses_another_python_version(tmp_path):
    pytest.importorskip("torch")
    proc = bash(INSTALL, str(fake_wheelhouse(tmp_path / "wh", python_version="3.99")), "--python", sys.executable)
    assert proc.returncode != 0
    assert "for Python 3.99" in proc.stderr, proc.stderr
    assert "1/5" not in proc.stdout


def test_install_refuses_when_skipped_packages_are_missing(tmp_path):
    pytest.importorskip("torch")
    wh = fake_wheelhouse(tmp_path / "wh")
    manifest = (wh / "MANIFEST.txt").read_text().replace("expected-present: ",
                                                         "expected-present: numpy==2.4.6 surely-not-installed==1.0")
    (wh / "MANIFEST.txt").write_text(manifest)
    proc = bash(INSTALL, str(wh), "--python", sys.executable)
    assert proc.returncode != 0
    assert "surely-not-installed" in proc.stderr and "--full" in proc.stderr, proc.stderr


# ---------------------------------------------------------------- the real thing (network + build)
SLOW = pytest.mark.skipif(os.environ.get("UMST_TEST_OFFLINE_INSTALL") != "1",
                          reason="needs PyPI and a ~4-minute fairseq build; set UMST_TEST_OFFLINE_INSTALL=1")


@SLOW
def test_wheelhouse_then_offline_install_into_fresh_venv(tmp_path):
    import torch

    import e2e

    pv = "%d.%d" % sys.version_info[:2]
    # UMST_TEST_OFFLINE_DEST + UMST_TEST_OFFLINE_PIP_CACHE: reuse a wheelhouse folder and the pip
    # cache of an earlier run there, so pip reuses the fairseq wheel it built then (no 4-minute build)
    wh = Path(os.environ.get("UMST_TEST_OFFLINE_DEST") or tmp_path / "wh")
    cache = os.environ.get("UMST_TEST_OFFLINE_PIP_CACHE") or str(tmp_path / "cache")
    proc = bash(WHEELHOUSE, "--full", "--python-version", pv, "--dest", str(wh), "--builder-python", sys.executable,
                timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = [f for f in os.listdir(wh) if f.endswith((".whl", ".tar.gz"))]
    assert not [f for f in names if TORCH_FAMILY.match(norm(f.split("-")[0]))]

    # a fresh venv whose torch stands in for the node's own (from PyPI / pip's cache)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", f"torch=={torch.__version__.split('+')[0]}"], check=True)

    # offline: no index, and no network at all where unshare is allowed
    env = {**os.environ, "PIP_NO_INDEX": "1", "XDG_CACHE_HOME": cache}
    cmd = ["bash", INSTALL, str(wh), "--python", py]
    if subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0:
        cmd = ["unshare", "-rn"] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "umst-plugin's requirements are all met" in proc.stdout
    assert "plugin archs:" in proc.stdout

    # one fairseq-train update on the toy corpus with the fresh venv's tools (the data prepared here)
    raw = e2e.make_toy_corpus(str(tmp_path / "raw"), n_train=60, n_valid=10, n_test=10, merges=100)
    vbin = venv / "bin"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    clean["OMP_NUM_THREADS"] = "1"

    def run(*args):
        p = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=clean, cwd=str(tmp_path))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        return p.stdout + p.stderr

    prefs = ["--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid"]
    run(vbin / "fairseq-preprocess", "--source-lang", "kel", "--target-lang", "mor", *prefs,
        "--destdir", tmp_path / "bin", "--joined-dictionary", "--workers", "1")
    run(py, "-m", "umst_plugin.preprocess", "--source-lang", "kel", "--target-lang", "mor", *prefs,
        "--destdir", tmp_path / "bin", "--parser", "conllu")
    user_dir = run(py, "-c", "import os, umst_plugin; print(os.path.dirname(umst_plugin.__file__))").strip()
    assert user_dir.startswith(str(venv)), user_dir  # the installed plugin, not this checkout
    log = run(vbin / "fairseq-train", tmp_path / "bin", "--user-dir", user_dir, "--task", "multiscale_translation",
              "--arch", "umst_base", *e2e.TINY, "--optimizer", "adam", "--lr", "1e-3",
              "--criterion", "label_smoothed_cross_entropy", "--max-tokens", "1000", "--max-update", "1",
              "--save-dir", tmp_path / "ckpt", "--no-save", "--disable-validation", "--num-workers", "0",
              "--data-buffer-size", "0", "--log-format", "simple", "--log-interval", "1", "--no-progress-bar")
    assert "done training" in log, log[-3000:]
