#!/usr/bin/env python3
"""fairseq-hydra-train, giving argparse-style models the Namespace fairseq-train would.

Same command line as fairseq-hydra-train (scripts/train.sh uses it). Plain
fairseq-hydra-train hands legacy models the YAML's DictConfig, which fails for
fairseq's lightconv (add_args defaults missing) and for TransformerModel
subclasses with their own flags (transformer_sf). See umst_plugin/legacy_hydra.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from umst_plugin.legacy_hydra import install  # noqa: E402

install()

from fairseq_cli.hydra_train import cli_main  # noqa: E402

if __name__ == "__main__":
    cli_main()
