"""The Explorer: plain-Python state (``state``) under a thin ipywidgets layer
(``widgets``)."""
