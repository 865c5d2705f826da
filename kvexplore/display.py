"""One display protocol for every result kvexplore returns.

Every result type (``Plan``, ``EditResult``, ``RoundTripReport``,
``OffloadResult``, the layouts, capacity answers) has the same trio:

* ``text()``: a deterministic plain-text form (terminals, the CLI, nbval);
* ``_repr_html_()``: what Jupyter shows (and the Explorer's panels);
* ``figure()``: a matplotlib ``Figure`` (not managed by pyplot).

The forms themselves live in the rendering stage (:mod:`kvexplore.rendering`),
which maps each type to its three functions.  A result type only inherits
:class:`Displayable`; it never imports the rendering stage, so the stages
before rendering stay free of matplotlib and HTML, and the rendering module
is imported on the first call of a form.
"""

from __future__ import annotations

import importlib

FORMS = ("text", "html", "figure")


def render(form: str, obj):
    """``form`` (``"text"``, ``"html"`` or ``"figure"``) of ``obj``, by the
    rendering stage's table of renderers."""
    rendering = importlib.import_module("kvexplore.rendering")
    return rendering.render(form, obj)


class Displayable:
    """Mixin giving a result type the display trio (see module doc)."""

    __slots__ = ()

    def text(self) -> str:
        """Plain-text form: deterministic, no addresses or timings."""
        return render("text", self)

    def _repr_html_(self) -> str:
        return render("html", self)

    def figure(self):
        """The result drawn, as a matplotlib ``Figure``."""
        return render("figure", self)
