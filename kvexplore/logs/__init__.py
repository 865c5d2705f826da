"""vLLM start-up logs: read one (:func:`read_log`), check it against
kvexplore's plan of the deployment it describes (:func:`check_log`), and
calibrate capacity answers from what it measured (:func:`calibrate`).

:mod:`kvexplore.logs.reading` needs neither vLLM nor torch; checking and
calibrating plan with the installed vLLM."""

from kvexplore.logs.reading import DEPLOYMENT, FIGURES, LogFigure, VllmLog, read_log


def __getattr__(name):
    if name in ("check_log", "LogCheck"):
        from kvexplore.logs import checking

        return getattr(checking, name)
    if name == "calibrate":
        from kvexplore.logs import calibrating

        return calibrating.calibrate
    raise AttributeError(f"module 'kvexplore.logs' has no attribute {name!r}")


__all__ = [
    "DEPLOYMENT",
    "FIGURES",
    "LogCheck",
    "LogFigure",
    "VllmLog",
    "calibrate",
    "check_log",
    "read_log",
]
