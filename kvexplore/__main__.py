"""``python -m kvexplore`` is the ``kvexplore`` command."""

import sys

from kvexplore.cli import main

sys.exit(main())
