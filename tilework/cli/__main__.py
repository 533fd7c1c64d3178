"""``python -m tilework.cli``: the command line (the same as ``tilework`` and ``python -m tilework``)."""

import sys

from tilework.cli import main

sys.exit(main())
