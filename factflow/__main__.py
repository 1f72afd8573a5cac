"""``python -m factflow``: the command line (see :mod:`factflow.cli`)."""

import sys

from factflow.cli import main

sys.exit(main())
