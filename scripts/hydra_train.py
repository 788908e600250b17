#!/usr/bin/env python3
"""fairseq-hydra-train, with argparse-style models' add_args defaults filled in.

Same command line as fairseq-hydra-train (scripts/train.sh uses it). Plain
``fairseq-hydra-train --config-dir configs --config-name ROW`` works for the rows
whose model keeps all its defaults in its arch function; this wrapper also covers
legacy models that read ``add_args`` defaults directly (fairseq's lightconv, for
one). See umst_plugin/legacy_hydra.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from umst_plugin.legacy_hydra import install  # noqa: E402

install()

from fairseq_cli.hydra_train import cli_main  # noqa: E402

if __name__ == "__main__":
    cli_main()
