#!/usr/bin/env python3
"""Every Multi30k row, several seeds: train, average, decode, score, tabulate (umst_tools/multi30k; --help)."""
import sys

from umst_tools.multi30k.cli import main

if __name__ == "__main__":
    sys.exit(main())
