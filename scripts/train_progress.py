#!/usr/bin/env python3
"""fairseq-train's log in, one progress line at most every few seconds out (umst_tools/train_progress.py)."""
import sys

from umst_tools.train_progress import main

if __name__ == "__main__":
    sys.exit(main())
