"""umst_plugin: multiscale encoders (UMST, TranSFormer, MSC, MSMSA, Prime) for fairseq.

fairseq itself is not listed in install_requires: the only distribution that
imports on Python 3.11 is ``fairseq-fixed==0.12.3.1``, and it must be installed
with ``--no-deps`` (its torchaudio requirement would replace torch). Run
``bash scripts/setup_env.sh`` or follow docs/install.md.
"""
from setuptools import find_packages, setup

setup(
    name="umst-plugin",
    version="0.1.0",
    description="Multiscale encoders for fairseq: five encoder families, dependency-parse preprocessing, WMT recipes",
    packages=find_packages(include=["umst_plugin", "umst_plugin.*", "umst_tools", "umst_tools.*"]),
    python_requires=">=3.9",
    install_requires=[
        "torch>=2.1",
        "numpy",
        "sacrebleu>=2.0",
        "tqdm",
        "conllu>=4.5",
        # fairseq-fixed's real runtime needs (it is installed with --no-deps)
        "hydra-core>=1.3,<1.4",
        "omegaconf>=2.3,<2.4",
        "bitarray",
        "regex",
        "cffi",
        "cython",
        "scikit-learn",
        "packaging",
        # fairseq-train --tensorboard-logdir (and no "Please install tensorboardX" on every start)
        "tensorboardX",
    ],
    extras_require={
        "stanza": ["stanza>=1.5"],
        "spacy": ["spacy>=3.5"],
        "recipes": ["sacremoses", "subword-nmt"],
        "test": ["pytest", "pytest-xdist", "matplotlib"],
        "inspect": ["matplotlib"],
    },
    entry_points={
        "console_scripts": [
            "umst-preprocess=umst_plugin.preprocess.cli:main",
            "umst-toy-corpus=umst_plugin.toy:main",
            "umst-average-checkpoints=umst_plugin.average_checkpoints:main",
            "umst-inspect=umst_plugin.inspect:main",
        ],
    },
)
