#!/usr/bin/env python3
"""The WMT recipes' text preparation (umst_tools/wmt_prep.py; --help)."""
import sys

from umst_tools.wmt_prep import main

if __name__ == "__main__":
    sys.exit(main())
