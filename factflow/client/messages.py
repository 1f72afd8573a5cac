"""What both clients share: the wire format of protocol 1 and query results assembled from diffs.

Requests go out as JSON text (instants as ISO-8601 strings); a frame that comes in holds
one message or an array of them, each a reply (it has an ``id``) or a pushed change (it
has a ``type``). :func:`reply_result` turns a reply into its result or raises the
:class:`~factflow.errors.ServerError` it carries; :func:`read_push` turns a pushed message
into a :class:`Push` with rows as tuples. :class:`Subscribers` holds the functions
subscribed to a query or attribute; :class:`QueryState` also sums a query's pushed diffs
into its current result, which :class:`QueryHandle`, the base of
:class:`factflow.client.RemoteQuery` and :class:`factflow.client.AsyncRemoteQuery`, shows.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from factflow.errors import ConnectionClosedError, EngineClosedError, ServerError

__all__ = ["PROTOCOL_VERSION", "Push", "QueryHandle", "QueryState", "Subscriber", "Subscribers", "encode_request",
           "decode_frame", "is_push", "reply_result", "read_push", "as_row", "close_description", "default_query_name",
           "interest_request", "identity"]

log = logging.getLogger("factflow.client")

PROTOCOL_VERSION = 1

#: ``fn(epoch, [(row, diff), ...])``, as for :meth:`factflow.Query.subscribe`.
Subscriber = Callable[[int, list], None]


def _json_value(value: Any) -> Any:
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"cannot send a {type(value).__name__} to a factflow server: {value!r}")


def encode_request(op: str, request_id: int, fields: dict[str, Any]) -> str:
    """A request as JSON text; fields that are None are left out (the server's defaults apply).

    A value JSON cannot carry (NaN, infinity, an object other than a datetime) is refused
    here as the server refuses bad input: :class:`ServerError` with category ``incorrect``.
    """
    message = {"op": op, "id": request_id, **{k: v for k, v in fields.items() if v is not None}}
    try:
        return json.dumps(message, default=_json_value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ServerError("incorrect", f"{op}: {exc}", op) from None


def decode_frame(text: str | bytes) -> list[dict]:
    """The messages of one frame from the server; ValueError if it is not protocol JSON."""
    payload = json.loads(text)
    messages = payload if isinstance(payload, list) else [payload]
    if not all(isinstance(m, dict) and ("id" in m or "type" in m) for m in messages):
        raise ValueError(f"neither a reply nor a pushed change: {str(text)[:200]}")
    return messages


def is_push(message: dict) -> bool:
    """Whether a message is a pushed change (it has no request id)."""
    return "id" not in message


def reply_result(message: dict, op: str) -> Any:
    """The result of a reply to ``op``; raises :class:`ServerError` for an error reply."""
    if message.get("ok"):
        return message.get("result")
    error = message.get("error") or {}
    raise ServerError(error.get("category", "fault"), error.get("message", "the server gave no reason"), op)


def as_row(value: Any) -> Any:
    """A row (or value) from JSON with every array as a tuple, so that rows are dict keys."""
    if isinstance(value, list):
        return tuple(as_row(v) for v in value)
    return value


def close_description(url: str, closed: ConnectionClosed) -> str:
    """Why the connection to ``url`` closed, for the error every request then raises."""
    if closed.rcvd is None:
        return f"the connection to {url} was lost (no close frame from the server)"
    code = closed.rcvd.code
    try:
        meaning = CloseCode(code).name.lower().replace("_", " ")
    except ValueError:
        meaning = "close code"
    reason = f": {closed.rcvd.reason}" if closed.rcvd.reason else ""
    return f"the server closed the connection to {url} ({meaning}, {code}){reason}"


@dataclass(frozen=True)
class Push:
    """A pushed change: ``kind`` is ``diff`` (of the query ``name``) or ``attribute`` (of the
    attribute ``name``); ``changes`` are ``(row, diff)`` pairs, rows as tuples (an
    attribute's rows are ``(entity, value)``)."""

    kind: str
    name: str
    epoch: int
    changes: list[tuple[tuple, int]]


def read_push(message: dict) -> Push:
    """A pushed message as a :class:`Push`; ValueError for an unknown type."""
    kind = message.get("type")
    if kind == "diff":
        name = message["query"]
    elif kind == "attribute":
        name = message["attribute"]
    else:
        raise ValueError(f"unknown pushed message type {kind!r}")
    changes = [(as_row(row), diff) for row, diff in message["changes"]]
    return Push(kind, name, message["epoch"], changes)


def interest_request(query: str | None, name: str | None, inputs: Sequence[Any], join: str,
                     granularity: float | None, durable: bool) -> tuple[str, dict[str, Any]]:
    """The name an interest goes by and the fields of its ``interest`` request: a query's
    text (named after it when unnamed), or the name alone of a published query."""
    if query is None:
        if name is None:
            raise ServerError("incorrect", "give the query's text, or the name of a published query", "interest")
        return name, {"name": name, "granularity": granularity}
    name = name or default_query_name(query, inputs, join)
    return name, {"name": name, "query": query, "inputs": list(inputs) or None, "join": join,
                  "granularity": granularity, "durable": durable or None}


def identity(hello: dict[str, Any]) -> tuple[str, str | None, str | None, int | None]:
    """From the reply to ``hello``: the client's id, its tenant's name, role and entity (None
    on a server without tenants; the entity only for a tenant)."""
    return hello["client"], hello.get("tenant"), hello.get("role"), hello.get("entity")


def default_query_name(text: str, inputs: Sequence[Any], join: str) -> str:
    """The name of a query the caller did not name: derived from its text, inputs and join,
    so that clients asking the same query share one dataflow on the server."""
    key = json.dumps([text, list(inputs), join], default=_json_value, sort_keys=True)
    return "q-" + hashlib.sha256(key.encode()).hexdigest()[:16]


Entry = tuple[Subscriber, Callable[[str | None], None] | None]


class Subscribers:
    """The functions subscribed to one stream of pushes (a query's or an attribute's), each
    with an optional ``on_end(failure)`` called when the stream ends (``failure`` is None
    when it was closed, else why the connection was lost). Safe to use from any thread.

    A push reaches the subscribers of the moment it was received (:meth:`entries`, taken
    by the reader) that are still subscribed when it is delivered (:meth:`notify`): none
    subscribed later (for a query, whose result already holds the push when it subscribes),
    none unsubscribed before.
    """

    def __init__(self):
        self._entries: list[Entry] = []
        self._lock = threading.RLock()

    def add_subscriber(self, fn: Subscriber, on_end: Callable[[str | None], None] | None = None) -> Callable[[], None]:
        """Subscribe ``fn``; returns the function that unsubscribes it."""
        entry = (fn, on_end)
        with self._lock:
            self._entries.append(entry)

        def unsubscribe() -> None:
            with self._lock:
                self._entries = [e for e in self._entries if e is not entry]

        return unsubscribe

    def entries(self) -> tuple[Entry, ...]:
        """The subscribers now."""
        with self._lock:
            return tuple(self._entries)

    def notify(self, push: Push, entries: tuple[Entry, ...]) -> None:
        """Call each of ``entries`` still subscribed with a push; a failing one is logged."""
        for entry in entries:
            with self._lock:
                subscribed = any(e is entry for e in self._entries)
            if subscribed:
                try:
                    entry[0](push.epoch, push.changes)
                except Exception:
                    log.exception("factflow client: a subscriber to %s failed at epoch %d", push.name, push.epoch)

    def end(self, failure: str | None) -> None:
        """The stream ended: tell those who asked, and drop every subscriber."""
        with self._lock:
            entries, self._entries = self._entries, []
        for _, on_end in entries:
            if on_end is not None:
                on_end(failure)


class QueryState(Subscribers):
    """A query interest as a client holds it: its current result, summed from the diffs
    pushed since the interest began (the first is the whole result at the install epoch),
    and the functions subscribed to its changes.

    The reader of the connection calls :meth:`apply`; any thread may call :meth:`results`.
    """

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.columns: list[str] = []
        self.epoch: int | None = None
        self.closed = False
        self.failure: str | None = None
        self._rows: dict[tuple, int] = {}

    def begin(self, reply: dict) -> None:
        """Take the columns (and the install epoch, if no diff came) from the interest reply."""
        with self._lock:
            self.columns = list(reply["columns"])
            if self.epoch is None:
                self.epoch = reply["epoch"]

    def apply(self, push: Push) -> tuple[Entry, ...]:
        """Add a pushed diff to the result; returns the subscribers to notify of it."""
        with self._lock:
            for row, diff in push.changes:
                total = self._rows.get(row, 0) + diff
                if total:
                    self._rows[row] = total
                else:
                    self._rows.pop(row, None)
            self.epoch = push.epoch
            return tuple(self._entries)

    def results(self) -> dict[tuple, int]:
        """The result as of the latest diff received: ``{row_tuple: multiplicity}``."""
        with self._lock:
            return dict(self._rows)

    def subscribe_from_now(self, fn: Subscriber,
                           on_end: Callable[[str | None], None]) -> tuple[Callable[[], None], int, dict[tuple, int]]:
        """Subscribe ``fn`` and take the result it starts from, at once: returns the
        unsubscribe function, the epoch and the result (the next push ``fn`` gets follows it)."""
        with self._lock:
            return self.add_subscriber(fn, on_end), self.epoch, dict(self._rows)

    def finish(self, failure: str | None) -> None:
        """The interest ended: closed (``failure`` None) or lost with the connection."""
        self.closed = True
        self.failure = failure
        self.end(failure)

    def check(self) -> None:
        """Raise if the interest ended: why the connection was lost, or that it was closed."""
        if self.failure is not None:
            raise ConnectionClosedError(self.failure)
        if self.closed:
            raise EngineClosedError(f"query {self.name} is closed")


class QueryHandle:
    """What both clients' query handles share: the result and subscriptions of a :class:`QueryState`.

    Once the interest ended, every public method and property but ``name``, ``closed`` and
    ``close`` raises: :class:`~factflow.errors.EngineClosedError` after a close,
    :class:`~factflow.errors.ConnectionClosedError` (saying why) when the connection was lost."""

    def __init__(self, state: QueryState):
        self._state = state

    @property
    def name(self) -> str:
        """The query's name on the server."""
        return self._state.name

    @property
    def columns(self) -> list[str]:
        """The ``:find`` elements, in order."""
        self._state.check()
        return self._state.columns

    @property
    def epoch(self) -> int:
        """The epoch of the latest diff received (at first, the install epoch)."""
        self._state.check()
        return self._state.epoch

    @property
    def closed(self) -> bool:
        """Whether the interest ended (closed, or the client closed or lost its connection)."""
        return self._state.closed

    def results(self) -> dict[tuple, int]:
        """The result as of :attr:`epoch`: ``{row_tuple: multiplicity}``, rows in ``:find``
        order (values as JSON gives them, see :mod:`factflow.client`)."""
        self._state.check()
        return self._state.results()

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn(epoch, [(row, diff), ...])`` for every later diff; returns the function
        that unsubscribes it."""
        self._state.check()
        return self._state.add_subscriber(fn)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"at epoch {self.epoch}"
        return f"<{type(self).__name__} {self.name} {state}>"


class UpdatesBase:
    """What both clients' update iterators share: a queue of ``(epoch, changes)`` fed by a
    query's subscription, ended by a marker (with the failure, if the connection was lost).
    Subclasses give the queue (``_put``) and the iteration protocol."""

    END = object()

    def __init__(self, state: QueryState, initial: bool):
        self._ended: str | None = None
        self._unsubscribe, epoch, rows = state.subscribe_from_now(
            lambda epoch, changes: self._put((epoch, changes)), self._end)
        if initial:
            self._put((epoch, list(rows.items())))

    def _put(self, item: Any) -> None:
        raise NotImplementedError

    def _end(self, failure: str | None) -> None:
        self._ended = failure
        self._put(self.END)

    def _item(self, item: Any, stop: type[Exception]) -> tuple[int, list]:
        """``item`` taken from the queue, or the end: raises ``stop`` (or the lost connection's error)."""
        if item is self.END:
            self._put(self.END)  # every later call ends too
            if self._ended is not None:
                raise ConnectionClosedError(self._ended)
            raise stop
        return item

    def close(self) -> None:
        """Stop receiving diffs; iteration ends after those already received."""
        self._unsubscribe()
        self._end(None)
