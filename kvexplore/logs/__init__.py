"""vLLM start-up logs: read one (:func:`read_log`), check it against
kvexplore's plan of the deployment it describes (:func:`check_log`), and
calibrate capacity answers from what it measured (:func:`calibrate`)."""

from kvexplore.logs.reading import DEPLOYMENT, FIGURES, LogFigure, VllmLog, read_log

__all__ = ["DEPLOYMENT", "FIGURES", "LogFigure", "VllmLog", "read_log"]
