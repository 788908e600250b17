"""The Multi30k comparison runner (``scripts/multi30k_table.py``), by concern:

config (rows, constants, option types) -> files, logs, machine -> runs (one run's commands and state) ->
archive, evaluation -> training, significance -> tables, plots -> cli. The names tests and callers use are
re-exported here.
"""
from umst_tools.multi30k.archive import *  # noqa: F401,F403
from umst_tools.multi30k.cli import main  # noqa: F401
from umst_tools.multi30k.config import *  # noqa: F401,F403
from umst_tools.multi30k.evaluation import *  # noqa: F401,F403
from umst_tools.multi30k.files import *  # noqa: F401,F403
from umst_tools.multi30k.logs import *  # noqa: F401,F403
from umst_tools.multi30k.machine import *  # noqa: F401,F403
from umst_tools.multi30k.plots import *  # noqa: F401,F403
from umst_tools.multi30k.runs import *  # noqa: F401,F403
from umst_tools.multi30k.significance import *  # noqa: F401,F403
from umst_tools.multi30k.tables import *  # noqa: F401,F403
from umst_tools.multi30k.training import *  # noqa: F401,F403
