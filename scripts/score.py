#!/usr/bin/env python3
"""BLEU from a fairseq-generate output, as the WMT recipes report it (umst_tools/score.py; used by evaluate.sh)."""
import sys

from umst_tools.score import main

if __name__ == "__main__":
    sys.exit(main())
