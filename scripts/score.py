#!/usr/bin/env python3
"""BLEU as the papers report it, from a fairseq-generate output (umst_tools/score.py; used by evaluate.sh)."""
import sys

from umst_tools.score import main

if __name__ == "__main__":
    sys.exit(main())
