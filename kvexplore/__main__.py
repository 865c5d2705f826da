"""``python -m kvexplore`` is the ``kvexplore`` command."""

from kvexplore.cli import console

console()
