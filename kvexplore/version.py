"""kvexplore's release (``pyproject.toml`` declares the same), read without
importing any stage, and the one parser of release strings every stage uses
(vLLM's, LMCache's, a log's)."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

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


__all__ = ["VERSION", "parse_release"]
