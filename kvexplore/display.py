"""One display protocol for every result kvexplore returns.

Every result type (``Plan``, ``Admission``, ``Drafter``, ``EditResult``,
``RoundTripReport``, ``OffloadResult``, the layouts, capacity answers, the
release comparisons) derives from :class:`Displayable`, so it has ``text()``
(plain text, deterministic), ``_repr_html_()`` (what Jupyter and the Explorer
show) and ``figure()`` (a matplotlib ``Figure`` not managed by pyplot).  Each
is a ``functools.singledispatch`` function on the result's class
(:func:`text_form`, :func:`html_form`, :func:`figure_form`), and every stage
registers its forms the same way, with :func:`register_forms` and a mapping
``type -> (text, html, figure)``: the stages before rendering carry no HTML or
matplotlib code, :mod:`kvexplore.rendering` registers theirs, and a stage
after it (``kvexplore.versions``, ``kvexplore.explorer``) registers its own
types' forms in the module that defines them.

The forms are found on first use whether or not the rendering stage was
imported: a type with no registered form makes the lookup import the modules
of :data:`FORM_MODULES` (with :mod:`importlib`, at call time, so no import
runs up the pipeline) and look again.  A type that still has none raises
:class:`~kvexplore.errors.KVExploreError`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping

from kvexplore.errors import KVExploreError

#: Modules whose import registers the forms of types defined before them,
#: imported in this order on a type's first lookup that finds no form.
FORM_MODULES = ("kvexplore.rendering",)


def _missing(form: str, obj) -> KVExploreError:
    return KVExploreError(
        f"{type(obj).__name__} has no {form} form; expected a kvexplore result "
        f"(one whose type {', '.join(FORM_MODULES)} or its own module registers)"
    )


def _after_registration(dispatcher, form: str, obj):
    """``dispatcher(obj)`` once :data:`FORM_MODULES` registered their forms;
    refused when ``type(obj)`` has none even then."""
    base = dispatcher.registry[object]
    for name in FORM_MODULES:
        importlib.import_module(name)
        impl = dispatcher.dispatch(type(obj))
        if impl is not base:
            return impl(obj)
    raise _missing(form, obj)


@functools.singledispatch
def text_form(obj) -> str:
    """The deterministic plain-text form of a result."""
    return _after_registration(text_form, "text", obj)


@functools.singledispatch
def html_form(obj) -> str:
    """The HTML form of a result (escaped, deterministic)."""
    return _after_registration(html_form, "html", obj)


@functools.singledispatch
def figure_form(obj):
    """A result drawn as a matplotlib ``Figure``."""
    return _after_registration(figure_form, "figure", obj)


Form = Callable[[object], object]


def register_forms(
    forms: Mapping[type, tuple[Form | None, Form | None, Form | None]],
) -> None:
    """Register each ``type -> (text, html, figure)`` of ``forms`` with
    :func:`text_form`, :func:`html_form` and :func:`figure_form`; a ``None``
    form is left unregistered (asking for it is refused by name)."""
    for cls, trio in forms.items():
        for dispatcher, form in zip(
            (text_form, html_form, figure_form), trio, strict=True
        ):
            if form is not None:
                dispatcher.register(cls, form)


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


__all__ = [
    "FORM_MODULES",
    "Displayable",
    "figure_form",
    "html_form",
    "register_forms",
    "text_form",
]
