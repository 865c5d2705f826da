"""kvexplore's release (``pyproject.toml`` declares the same), read without
importing any stage, the one parser of release strings every stage uses
(vLLM's, LMCache's, a log's) and the one check of a list of releases."""

from __future__ import annotations

from collections.abc import Callable

from packaging.version import InvalidVersion, Version

from kvexplore.errors import KVExploreError

VERSION = "0.1.0"


def parse_release(text: object) -> Version | None:
    """``text`` as a PEP 440 version (``"v0.5.2"``, ``" 0.34 "``,
    ``"0.29.1rc1.dev339"``), or ``None`` when it is not a string or not a
    version.  Callers decide what a release must have (three numbers, a
    known name)."""
    if not isinstance(text, str):
        return None
    try:
        return Version(text.strip())
    except InvalidVersion:
        return None


def release_list(value: object, *, what: str, spell: Callable[[str], str], expected: str,
                 minimum: int = 1) -> tuple[str, ...]:
    """The releases ``value`` names (a list or tuple of strings, or one
    comma-separated string), each spelled by ``spell`` (which refuses one it
    does not know: ``canonical_release`` for vLLM), in the order given.

    Refused with one :class:`KVExploreError` naming ``what``, the value and
    ``expected``: a value of another type or holding a non-string, a release
    named twice after spelling (both spellings named), fewer than ``minimum``.

    >>> release_list("0.5.2, 0.5.6", what="lmcache", spell=str.strip, expected="releases")
    ('0.5.2', '0.5.6')
    """
    if isinstance(value, str):
        given = [v for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        given = list(value)
    else:
        raise KVExploreError(f"{what}={value!r:.80} is invalid; {expected}")
    out = [spell(v) for v in given]
    for release in out:
        if out.count(release) > 1:
            same = [g for g, r in zip(given, out, strict=True) if r == release]
            raise KVExploreError(
                f"{what}={given!r} names a release twice ({' and '.join(map(repr, same))} are "
                f"the same release {release}); {expected}, each once"
            )
    if len(out) < minimum:
        raise KVExploreError(f"{what}={given!r} is invalid; {expected}")
    return tuple(out)


__all__ = ["VERSION", "parse_release", "release_list"]
