import sys

from umst_plugin.preprocess.cli import main

sys.exit(main())
