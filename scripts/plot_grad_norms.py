#!/usr/bin/env python3
"""MSC's encoder gradient norms per layer as a picture (umst_tools/plot_grad_norms.py)."""
import sys

from umst_tools.plot_grad_norms import main

if __name__ == "__main__":
    sys.exit(main())
