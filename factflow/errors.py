"""factflow's exception types.

Every error raised through the public API is a :class:`FactflowError`. Messages name the
offending item (the clause, attribute, value or rule) so that the user can find it.
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
    """A transaction or query names an attribute that was never created."""


class TransactionError(FactflowError):
    """A transaction was rejected; nothing of it was applied."""


class QueryError(FactflowError):
    """A query or rule is malformed, unsafe or uses the language incorrectly."""


class RuleError(QueryError):
    """A rule definition is invalid, clashes with a registered rule or cannot be resolved."""


class EngineClosedError(FactflowError):
    """The engine (or a query) was used after it was closed."""


class ExecutionError(FactflowError):
    """Spark failed while running an epoch or an install; it was rolled back and the
    engine stays usable. The Spark error is chained as ``__cause__``."""
