"""The trajectory viewer: a static HTML report of a run directory (``legato view``)."""

from .report import Report, best_and_worst, make_thumbnail, safe_name, write_report
from .strip import rollout_strip

__all__ = [
    "Report",
    "best_and_worst",
    "make_thumbnail",
    "rollout_strip",
    "safe_name",
    "write_report",
]
