"""``python -m fdsl``: the ``fdsl`` command, for when its script is not on PATH."""

import sys

from fdsl.cli import main

sys.exit(main())
