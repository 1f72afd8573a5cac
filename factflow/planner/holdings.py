"""What installing allocates for one owner (a query, or a rule shared by queries), to release together."""

from __future__ import annotations

from typing import TYPE_CHECKING

from factflow.arrangement.views import drop_view
from factflow.edn import Keyword

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

    from factflow.arrangement.trace import Trace, TraceHandle

__all__ = ["Holdings"]


class Holdings:
    """Trace handles, private traces (with their roles) and temp views an owner holds, and
    the attributes its operators read."""

    def __init__(self, spark: "SparkSession | None" = None):
        self.spark = spark  # set when the first view is allocated (see factflow.engine.allocation)
        self.handles: list["TraceHandle"] = []
        self.traces: list[tuple["Trace", str]] = []
        self.views: list[str] = []
        self.attributes: set[Keyword] = set()

    def release(self) -> None:
        """Release every handle, trace and view held."""
        for h in self.handles:
            h.release()
        for trace, _ in self.traces:
            trace.close()
        for view in self.views:
            drop_view(self.spark, view)
        self.handles, self.traces, self.views = [], [], []
