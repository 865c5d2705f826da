"""One display protocol for every result kvexplore returns.

Every result type (``Plan``, ``EditResult``, ``RoundTripReport``,
``OffloadResult``, the layouts, capacity answers) has ``text()`` (plain text,
deterministic), ``_repr_html_()`` (what Jupyter and the Explorer show) and
``figure()`` (a matplotlib ``Figure`` not managed by pyplot).  Each is a
``functools.singledispatch`` function on the result's class (:func:`text_form`,
:func:`html_form`, :func:`figure_form`); :mod:`kvexplore.rendering` registers
the implementations, so the stages before it carry no HTML or matplotlib code.
A type with no registered form raises :class:`~kvexplore.errors.KVExploreError`.
"""

from __future__ import annotations

import functools

from kvexplore.errors import KVExploreError


def _missing(form: str, obj) -> KVExploreError:
    return KVExploreError(
        f"{type(obj).__name__} has no {form} form; expected a kvexplore result "
        "(import kvexplore to register the rendering stage's forms)"
    )


@functools.singledispatch
def text_form(obj) -> str:
    """The deterministic plain-text form of a result."""
    raise _missing("text", obj)


@functools.singledispatch
def html_form(obj) -> str:
    """The HTML form of a result (escaped, deterministic)."""
    raise _missing("html", obj)


@functools.singledispatch
def figure_form(obj):
    """A result drawn as a matplotlib ``Figure``."""
    raise _missing("figure", obj)


class Displayable:
    """Mixin giving a result type the display trio (see module doc)."""

    __slots__ = ()

    def text(self) -> str:
        """Plain-text form: deterministic, no addresses or timings."""
        return text_form(self)

    def _repr_html_(self) -> str:
        return html_form(self)

    def figure(self):
        """The result drawn, as a matplotlib ``Figure``."""
        return figure_form(self)


__all__ = ["Displayable", "figure_form", "html_form", "text_form"]
