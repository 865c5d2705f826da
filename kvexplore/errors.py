"""kvexplore's one error type.

Every error a user can trigger through the public API is a ``KVExploreError``,
a ``ValueError`` subclass, whose message names the bad value and what was
expected.  Catch ``ValueError`` to handle them all.
"""


class KVExploreError(ValueError):
    """A user-facing error with the offending value and what was expected."""
