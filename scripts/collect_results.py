#!/usr/bin/env python3
"""Collect the evaluated rows into the markdown table with the papers' numbers (umst_tools/collect_results.py)."""
import sys

from umst_tools.collect_results import main

if __name__ == "__main__":
    sys.exit(main())
