"""``python -m tilework``: the command line (``tilework --help``)."""

import sys

from tilework.cli import main

sys.exit(main())
