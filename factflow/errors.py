"""factflow's exception types.

Every error raised through the public API is a :class:`FactflowError`. Messages name the
offending item (the operation or DataFrame row, clause, attribute, value, rule, line and
column) so that the user can find it. The type says what was rejected::

    FactflowError
    ├── EdnSyntaxError          text is not EDN (from factflow.edn.read)
    ├── SchemaError             create_attribute rejected a definition
    │   └── UnknownAttributeError   a lookup by name found no attribute
    ├── TransactionError        Engine.transact rejected the transaction
    │   ├── LateTransactionError    (event time) its time is before the frontier
    │   └── LoadError           Engine.load rejected a source (a column that does not convert,
    │                           a bad entity column, a missing column or attribute)
    ├── IngestError             Engine.ingest rejected a stream (not streaming, missing columns,
    │                           column t and the engine's time domain disagree, a bad option)
    ├── QueryError              Engine.query rejected the query
    │   └── RuleError           Engine.register rejected the rules, or a query calls a rule
    │                           that is unknown or cannot be resolved
    ├── ExecutionError          Spark failed while running an epoch (rolled back)
    ├── HistoryError            a read as of an epoch outside the history kept (slack)
    ├── EngineClosedError       the engine or query was used after close()
    ├── ConfigurationError      the Spark session cannot run factflow (checked when an engine starts)
    ├── ServerError             a factflow server refused a client's request (.category says why)
    ├── ConnectionClosedError   a client's connection to a server failed to open or closed
    ├── RequestTimeoutError     a client waited longer than its timeout for a reply
    ├── HistoryCompactedError   a query's changes were asked for from an epoch compacted away
    ├── SinkError               a sink was rejected (bad options, a directory it cannot continue)
    └── StorageError            the state directory could not be written or read
        ├── StateLockedError        another engine holds the state directory
        ├── StateVersionError       the state directory was written by a newer format version
        └── CorruptStateError       a checksum failed, or the log or a checkpoint is damaged

A rejected transaction always raises :class:`TransactionError` and a rejected query
:class:`QueryError`, whatever the cause: when the cause is another factflow error (an
:class:`EdnSyntaxError` for malformed text, an :class:`UnknownAttributeError` for an
attribute never created) it is chained as ``__cause__`` and its message is repeated.
"""


class FactflowError(Exception):
    """Base class of every error factflow raises on purpose."""


class EdnSyntaxError(FactflowError):
    """Text that is not well-formed EDN; the message gives line and column."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        where = f" (line {line}, column {column})" if line is not None else ""
        super().__init__(message + where)
        self.line = line
        self.column = column


class SchemaError(FactflowError):
    """An attribute definition is invalid or conflicts with an existing one."""


class UnknownAttributeError(SchemaError):
    """An attribute looked up by name was never created (in a transaction or query, the
    cause of the TransactionError or QueryError raised)."""


class TransactionError(FactflowError):
    """A transaction was rejected, for whatever reason; nothing of it was applied."""


class LateTransactionError(TransactionError):
    """An event-time transaction came for a time that is already closed (before the
    engine's frontier); the message names the time and the frontier. Nothing changed."""


class LoadError(TransactionError):
    """``Engine.load`` rejected a source: a column whose values do not convert to their
    attribute's type (the message names the attribute, the column, how many rows, and an
    example value with its entity), entity ids that are missing or not integers (naming an
    example), a column or attribute that does not exist; nothing of it was applied."""


class IngestError(FactflowError):
    """``Engine.ingest`` refused to start a stream: the DataFrame is not streaming, lacks
    column ``e``, ``a`` or ``v``, has an event-time column ``t`` on an engine in
    transaction time (or lacks it in event time), or an option is invalid; nothing was
    started."""


class QueryError(FactflowError):
    """A query or rule was rejected: malformed text, unknown attributes, unsafe variables,
    type errors or other misuse of the language; nothing of it was installed."""


class RuleError(QueryError):
    """A rule definition is invalid, clashes with a registered rule or cannot be resolved."""


class HistoryError(FactflowError):
    """A result was asked for as of an epoch the engine does not keep: older than the
    history its ``slack`` keeps, before the query was installed, or not closed yet; the
    message names the epoch and the range that can be read."""


class EngineClosedError(FactflowError):
    """The engine (or a query) was used after it was closed."""


class ConfigurationError(FactflowError):
    """The Spark session an engine was given or made cannot run factflow: its tasks' Python
    interpreter lacks factflow or a dependency, or has other versions (see
    :mod:`factflow.engine.preflight`). The message names the host, the interpreter, what
    is wrong and what to set; nothing was started."""


class ExecutionError(FactflowError):
    """Spark failed while running an epoch (or while installing a query); the epoch was
    rolled back (the query not installed) and the engine stays usable, unless the failure
    took the Spark driver with it: then the engine is closed (the message says so). A Spark
    error is chained as ``__cause__``."""


class ServerError(FactflowError):
    """A factflow server refused a request (see :mod:`factflow.client`); the message is the
    server's, ``category`` says why: ``incorrect`` (bad input: a rejected transaction, query
    or rule), ``not-found``, ``conflict``, ``forbidden``, ``unsupported`` or ``fault`` (a
    server bug); ``op`` is the refused operation."""

    def __init__(self, category: str, message: str, op: str | None = None):
        super().__init__(message)
        self.category = category
        self.op = op


class ConnectionClosedError(FactflowError):
    """A client's connection to a factflow server could not be opened, or closed (by either
    side, or because it failed); the message says why, with the close code and reason."""


class RequestTimeoutError(FactflowError):
    """No reply came within the client's timeout; the server may still carry the request out."""


class HistoryCompactedError(HistoryError):
    """``Query.changes_frame(since=...)`` asked for changes after an epoch whose history the
    query no longer keeps (compacted, or before its install); the message names the epoch
    asked for and the oldest one still available (``.oldest``)."""

    def __init__(self, message: str, since: int, oldest: int):
        super().__init__(message)
        self.since = since
        self.oldest = oldest


class SinkError(FactflowError):
    """A sink (see :mod:`factflow.io.sinks`) was rejected: an unknown format or mode, a
    directory written by a sink of another format, mode or columns, or one holding epochs
    after the engine's latest (another engine's output); nothing was written."""


class StorageError(FactflowError):
    """The state directory of a durable engine could not be written or read. Raised by
    ``transact`` when the epoch could not be logged (it was rolled back, and if the log
    could not be restored the engine refuses further writes until reopened)."""


class StateLockedError(StorageError):
    """Another engine (in this or another process) has the state directory open."""


class StateVersionError(StorageError):
    """The state directory (or one of its files) was written in a format version newer
    than this factflow reads."""


class CorruptStateError(StorageError):
    """A file of the state directory failed its checksum or is malformed, and recovery
    had nothing valid to fall back to; the message names the file."""
