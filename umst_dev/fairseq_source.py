"""fairseq-fixed from its source archive in seconds: unpack it and compile only what training and decoding use.

fairseq's ``setup.py`` compiles six extensions; three of them (libbase, libnat, the alignment binding) are
torch C++ extensions that take minutes to compile and serve models this plugin does not use (balanced
assignment, non-autoregressive edit distance, alignment training). ``build_light`` unpacks the sdist and
compiles the other three in place: ``data_utils_fast`` (``batch_by_size``, needed by fairseq-train and
fairseq-generate), ``token_block_utils_fast`` and ``libbleu`` (fairseq's own BLEU scorer). The tree is then used
with ``PYTHONPATH=<tree>``: ``python -m fairseq_cli.train`` etc. (no console scripts are installed).

Needs a C++ compiler, the Python headers, numpy and Cython in the Python that runs it.
"""
import glob
import os
import subprocess
import sys
import tarfile

LIGHT_BUILD = r'''
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

args = ["-std=c++11", "-O3"]
numpy_ext = dict(language="c++", include_dirs=[numpy.get_include()], extra_compile_args=args)
extensions = [
    Extension("fairseq.libbleu", ["fairseq/clib/libbleu/libbleu.cpp", "fairseq/clib/libbleu/module.cpp"],
              extra_compile_args=args),
    Extension("fairseq.data.data_utils_fast", ["fairseq/data/data_utils_fast.pyx"], **numpy_ext),
    Extension("fairseq.data.token_block_utils_fast", ["fairseq/data/token_block_utils_fast.pyx"], **numpy_ext),
]
setup(name="fairseq-light", ext_modules=cythonize(extensions, language_level=3, quiet=True),
      script_args=["build_ext", "--inplace", "--parallel", "{jobs}"])
'''


class BuildError(RuntimeError):
    pass


def find_sdist(wheelhouse):
    found = sorted(glob.glob(os.path.join(wheelhouse, "fairseq_fixed-*.tar.gz"))
                   + glob.glob(os.path.join(wheelhouse, "fairseq-fixed-*.tar.gz")))
    if not found:
        raise BuildError(f"{wheelhouse}: no fairseq-fixed source archive (fairseq_fixed-*.tar.gz); "
                         "make the folder with scripts/offline-wheelhouse.sh")
    return found[-1]


def safe_extraction(tar, sdist):
    """``extractall``'s keyword arguments that keep the archive's members inside the destination: tarfile's
    ``data`` filter where this Python has it (3.11.4 and later; Debian 12's 3.11.2 has not), else a check of every
    member here first: plain files and folders only, at relative paths that do not climb out (what a source archive
    holds; the filter would also allow links that stay inside)."""
    if hasattr(tarfile, "data_filter"):
        return dict(filter="data")
    for member in tar.getmembers():
        parts = member.name.replace("\\", "/").split("/")
        if not (member.isfile() or member.isdir()) or os.path.isabs(member.name) or ".." in parts:
            raise BuildError(f"{sdist}: member {member.name!r} is not a plain file or folder inside the archive; "
                             "not unpacked")
    return {}


def unpack(sdist, dest):
    """Unpack the archive into ``dest``; return the source tree (the folder holding ``fairseq/``)."""
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(sdist) as tar:
        extraction = safe_extraction(tar, sdist)
        try:
            top = os.path.commonpath(tar.getnames())
        except ValueError:  # absolute and relative names mixed
            raise BuildError(f"{sdist}: its members are not all under one top folder; not a source archive") from None
        tar.extractall(dest, **extraction)
    tree = os.path.join(dest, top)
    if not os.path.isdir(os.path.join(tree, "fairseq")) or not os.path.isdir(os.path.join(tree, "fairseq_cli")):
        raise BuildError(f"{sdist}: no fairseq/ and fairseq_cli/ inside; not a fairseq source archive")
    with open(os.path.join(tree, "fairseq", "version.txt")) as f:
        version = f.read().strip()
    with open(os.path.join(tree, "fairseq", "version.py"), "w") as f:  # what setup.py would write
        f.write(f'__version__ = "{version}"\n')
    return tree


def build_light(wheelhouse, dest, python=sys.executable, jobs=None, log=None, env=None):
    """Unpack fairseq-fixed's sdist from ``wheelhouse`` into ``dest`` and compile its three light
    extensions in place (``env``: the environment to compile in, e.g. a PYTHONPATH holding numpy and Cython).
    Returns the tree to put on PYTHONPATH."""
    tree = unpack(find_sdist(wheelhouse), dest)
    jobs = jobs or min(8, os.cpu_count() or 1)
    proc = subprocess.run([python, "-c", LIGHT_BUILD.replace("{jobs}", str(jobs))], cwd=tree,
                          capture_output=True, text=True, env=env)
    if log is not None:
        log.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise BuildError(f"compiling fairseq's extensions in {tree} failed (rc {proc.returncode}):\n"
                         + (proc.stderr or proc.stdout)[-3000:])
    built = glob.glob(os.path.join(tree, "fairseq", "data", "data_utils_fast*.so"))
    if not built:
        raise BuildError(f"{tree}: the build ran but fairseq/data/data_utils_fast*.so is missing")
    return tree
