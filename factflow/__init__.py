"""factflow: Datalog queries maintained incrementally over streams of facts, on Apache Spark.

Model a domain as facts ``[entity attribute value]``, stream assertions and retractions
in with :meth:`Engine.transact`, install Datalog queries with :meth:`Engine.query`, and
receive every query's result as consistent changes after each epoch.
"""

from factflow.engine.engine import Engine, EngineConfig, EpochReport, SparkJob
from factflow.engine.query import Query
from factflow.engine.session import create_session
from factflow.io.sinks import Sink
from factflow.model.pulled import PullMap
from factflow.errors import (
    ConfigurationError, ConnectionClosedError, CorruptStateError, EdnSyntaxError, EngineClosedError, ExecutionError, FactflowError,
    HistoryCompactedError, HistoryError, IngestError, LateTransactionError, LoadError, QueryError, RequestTimeoutError,
    RuleError, SchemaError, ServerError, SinkError, StateLockedError, StateVersionError, StorageError, TransactionError,
    UnknownAttributeError,
)

__version__ = "0.1.0"

__all__ = [
    "Engine", "EngineConfig", "EpochReport", "SparkJob", "Query", "PullMap", "create_session",
    "FactflowError", "ConfigurationError", "EdnSyntaxError", "SchemaError", "UnknownAttributeError", "TransactionError",
    "LoadError", "IngestError", "QueryError", "RuleError", "EngineClosedError", "ExecutionError", "ServerError",
    "ConnectionClosedError", "RequestTimeoutError", "HistoryCompactedError", "SinkError", "Sink", "StorageError",
    "StateLockedError", "StateVersionError", "CorruptStateError",
    "LateTransactionError", "HistoryError", "__version__",
]
