"""vLLM start-up logs: read one (:func:`read_log`), check it against
kvexplore's plan of the deployment it describes (:func:`check_log`), and
calibrate capacity answers from what it measured (:func:`calibrate`).

:mod:`kvexplore.logs.reading` needs neither vLLM nor torch; checking and
calibrating plan with the installed vLLM."""

from kvexplore.lazy import lazy_attributes
from kvexplore.logs.reading import DEPLOYMENT, FIGURES, LogFigure, VllmLog, read_log

__getattr__ = lazy_attributes(__name__, {
    "check_log": "kvexplore.logs.checking",
    "LogCheck": "kvexplore.logs.checking",
    "calibrate": "kvexplore.logs.calibrating",
})


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
