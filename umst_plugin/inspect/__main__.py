import sys

from umst_plugin.inspect import main

sys.exit(main())
