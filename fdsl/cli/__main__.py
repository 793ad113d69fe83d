"""``python -m fdsl.cli``: the ``fdsl`` command."""

import sys

from . import main

sys.exit(main())
