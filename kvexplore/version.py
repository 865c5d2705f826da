"""kvexplore's release (``pyproject.toml`` declares the same), read without
importing any stage."""

VERSION = "0.1.0"

__all__ = ["VERSION"]
