"""The blocking client: :class:`Client` and its :class:`RemoteQuery` handles.

Two threads serve a connection. The reader receives every frame: it matches a reply to
the waiting request by id, and adds a pushed diff to its query's result at once (so
``results()`` is current as soon as the diff is in). The dispatcher calls subscribers, one
push at a time in the order received, and hands replies to the threads waiting for them
in that same order: when ``transact`` returns epoch N, every subscriber of this client has
been called with epoch N (read-your-writes, as the server sends the diffs before the
reply). A subscriber may itself call the client (its reply is handed over directly, not
queued behind the push being delivered); the changes of an epoch it causes reach
subscribers after it returns.

Any thread may send requests at once: sends are serialized by a lock, replies are
matched by id. When the connection closes or fails, every waiting request and every
later one raises :class:`~factflow.errors.ConnectionClosedError` saying why.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import queue
import threading
import time
from functools import partial
from typing import Any, Callable, Iterator, Sequence

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.frames import CloseCode
from websockets.sync.client import ClientConnection, connect

from factflow.client.messages import (
    PROTOCOL_VERSION, Push, QueryHandle, QueryState, Subscriber, Subscribers, UpdatesBase, as_row, close_description,
    decode_frame, encode_request, identity, interest_request, is_push, read_push, reply_result,
)
from factflow.errors import ConnectionClosedError, RequestTimeoutError, ServerError

__all__ = ["Client", "RemoteQuery", "Updates"]

log = logging.getLogger("factflow.client")

#: How long a caller blocks at a time while it waits for a reply or a diff. CPython loses
#: a signal that arrives just as the main thread starts an untimed wait: a Ctrl-C pressed
#: then would never stop ``for epoch, changes in updates``. A timed wait wakes up and runs
#: the pending handler.
_SIGNAL_SLICE = 0.25


def _result(future: concurrent.futures.Future, timeout: float | None) -> Any:
    """``future.result(timeout)``, waiting in slices so that Ctrl-C is always noticed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = _SIGNAL_SLICE if deadline is None else min(_SIGNAL_SLICE, deadline - time.monotonic())
        try:
            return future.result(max(left, 0))
        except concurrent.futures.TimeoutError:
            if future.done() or (deadline is not None and time.monotonic() >= deadline):
                raise


class _Pending:
    """A request waiting for its reply; ``direct`` when sent by the dispatcher thread."""

    def __init__(self, direct: bool):
        self.direct = direct
        self.reply: concurrent.futures.Future = concurrent.futures.Future()


class _Feed(Subscribers):
    """This client's subscribers to one attribute; ``ready`` settles with the subscribe reply."""

    def __init__(self):
        super().__init__()
        self.ready: concurrent.futures.Future = concurrent.futures.Future()


class Client:
    """A blocking connection to a factflow server (``ws://host:port/``).

    ``token`` is sent in ``hello`` when the server requires one; on a server with tenants it
    names this client's tenant (:attr:`tenant`, :attr:`role` and, for a tenant, the
    :attr:`entity` standing for it in facts), and ``keep=True`` asks the server to keep the
    tenant's parameter facts when its last connection closes. ``timeout`` is how many
    seconds to wait for each reply before :class:`~factflow.errors.RequestTimeoutError`
    (None: as long as the connection lives; keepalive pings notice a dead server);
    ``connect_timeout`` bounds opening the connection. Use it as a context manager, or
    call :meth:`close`.
    """

    def __init__(self, url: str, token: str | None = None, timeout: float | None = None,
                 connect_timeout: float = 10.0, keep: bool = False):
        self.url = url
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards the tables below and the closing state
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._queries: dict[str, QueryState] = {}
        self._feeds: dict[str, _Feed] = {}
        self._closing = False
        self._failure: str | None = None  # why requests fail, once the connection is gone
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        try:
            self._ws: ClientConnection = connect(url, open_timeout=connect_timeout, max_size=None, legacy=True)
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
            raise ConnectionClosedError(f"cannot connect to {url}: {exc}") from exc
        self._reader = threading.Thread(target=self._read, name="factflow-client-reader", daemon=True)
        self._dispatcher = threading.Thread(target=self._dispatch, name="factflow-client-dispatcher", daemon=True)
        self._dispatcher.start()
        self._reader.start()
        try:
            hello = self.request("hello", protocol=PROTOCOL_VERSION, token=token, keep=keep or None)
            self.client_id, self.tenant, self.role, self.entity = identity(hello)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ the engine's operations
    def create_attribute(self, name: str, type: str = "string", semantics: str = "set", index: str = "both",
                         support: str = "wco", slack: int = 0, parameter: bool = False) -> dict[str, str]:
        """Define an attribute (as :meth:`factflow.Engine.create_attribute`; ``parameter``: a
        tenant parameter); returns its ``name``, ``type``, ``semantics`` and settings."""
        return self.request("create-attribute", name=name, type=type, semantics=semantics, index=index,
                            support=support, slack=slack, parameter=parameter or None)

    def transact(self, tx: Sequence[Sequence[Any]] | str) -> int:
        """Apply a transaction (``[[":db/add", e, a, v], ...]`` or EDN text) as one epoch;
        returns the epoch, whose diffs this client's subscribers have received."""
        return self.request("transact", tx=tx if isinstance(tx, str) else [list(op) for op in tx])["epoch"]

    def register(self, rules: str) -> list[str]:
        """Store rules (EDN text); returns the names of the rules defined."""
        return self.request("register", rules=rules)["rules"]

    def query(self, query: str | None = None, name: str | None = None, inputs: Sequence[Any] = (),
              join: str = "auto", granularity: float | None = None, durable: bool = False) -> RemoteQuery:
        """Become interested in a query; returns its handle, holding the current result.

        Without ``name`` the query is named after its text, inputs and join, so that clients
        asking the same query share one dataflow. With ``name`` alone, join the query an
        admin published under it (a tenant's rows only, without the tenant column, for a
        tenant-routed one). ``granularity`` (seconds) asks for at most one diff per that many
        seconds. ``durable`` (a server with a state directory) keeps the query installed
        without clients and across server restarts, until :meth:`drop`. A name this client
        is already interested in is refused (``conflict``), as the server refuses it.
        """
        name, fields = interest_request(query, name, inputs, join, granularity, durable)
        state = QueryState(name)
        with self._lock:
            if name in self._queries:
                raise ServerError("conflict", f"this client is already interested in a query named {name!r}",
                                  "interest")
            self._queries[name] = state  # before sending: the whole result is pushed before the reply
        try:
            result = self.request("interest", **fields)
        except BaseException:
            with self._lock:
                if self._queries.get(name) is state:
                    del self._queries[name]
            raise
        state.begin(result)
        return RemoteQuery(self, state)

    def publish(self, name: str, query: str, tenant: str | None = None, inputs: Sequence[Any] = (),
                join: str = "auto") -> dict[str, Any]:
        """Admin: publish ``query`` under ``name`` for tenants, routed by the ``:find``
        variable ``tenant`` (each tenant receives the rows of its own entity) or, without it,
        public; returns the reply (``columns`` as tenants receive them, ``created``)."""
        return self.request("publish", name=name, query=query, tenant=tenant, inputs=list(inputs) or None, join=join)

    def q(self, query: str, inputs: Sequence[Any] = ()) -> list[tuple]:
        """A one-shot answer: the rows of ``query`` as of now, as tuples in ``:find`` order
        (no interest remains)."""
        return [as_row(row) for row in self.request("query", query=query, inputs=list(inputs) or None)["rows"]]

    def subscribe_attribute(self, attribute: str, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn(epoch, [((entity, value), diff), ...])`` for every later change of
        ``attribute``; returns the function that unsubscribes it (the server keeps sending
        the attribute's changes to this client until it closes)."""
        with self._lock:
            self._check_open()
            feed = self._feeds.get(attribute)
            first = feed is None
            if first:
                feed = self._feeds[attribute] = _Feed()
        unsubscribe = feed.add_subscriber(fn)
        if first:
            try:
                self.request("subscribe", attribute=attribute)
            except BaseException as exc:
                with self._lock:
                    del self._feeds[attribute]
                feed.ready.set_exception(exc)
                raise
            feed.ready.set_result(None)
        else:
            _result(feed.ready, None)  # raises as the first subscription did
        return unsubscribe

    def explain(self, name: str) -> str:
        """The plan of the installed query ``name`` (any client's)."""
        return self.request("explain", name=name)["text"]

    def drop(self, name: str) -> None:
        """Close the query ``name`` on the server for good, durable or not (refused with
        ``conflict`` while other clients are interested); this client's handle on it ends."""
        self.request("drop", name=name)
        with self._lock:
            state = self._queries.pop(name, None)
        if state is not None:
            state.finish(None)

    def status(self) -> dict[str, Any]:
        """The server's ``epoch``, ``clients``, ``queries`` (name -> interested clients) and ``stats``."""
        return self.request("status")

    def shutdown(self) -> None:
        """Ask the server to stop (it then closes every connection, this one too)."""
        self.request("shutdown")

    # ------------------------------------------------------------ requests
    def request(self, op: str, **fields: Any) -> Any:
        """Send one request of the protocol (fields that are None are left out) and return the
        ``result`` of its reply; raises :class:`~factflow.errors.ServerError` for an error reply."""
        request_id = next(self._ids)
        text = encode_request(op, request_id, fields)
        pending = _Pending(direct=threading.current_thread() is self._dispatcher)
        with self._lock:
            self._check_open()
            self._pending[request_id] = pending
        try:
            with self._send_lock:
                self._ws.send(text)
        except ConnectionClosed:
            pass  # the reader fails every waiting request, this one too, saying why
        try:
            message = _result(pending.reply, self.timeout)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self._pending.pop(request_id, None)
            raise RequestTimeoutError(f"{op}: no reply from {self.url} within {self.timeout} s; "
                                      f"the server may still carry the request out") from None
        return reply_result(message, op)

    def _check_open(self) -> None:
        """Raise why no request can be sent (call under the lock)."""
        if self._failure is not None:
            raise ConnectionClosedError(self._failure)
        if self._closing:
            raise ConnectionClosedError("the client is closed")

    # ------------------------------------------------------------ the reader and the dispatcher
    def _read(self) -> None:
        try:
            while True:
                self._receive(self._ws.recv())
        except ConnectionClosed as exc:
            failure = "the client is closed" if self._closing else close_description(self.url, exc)
        except Exception as exc:  # an unreadable message or a bug: fail loudly rather than hang every caller
            log.exception("factflow client: cannot read a message from %s", self.url)
            failure = f"the connection to {self.url} was dropped: cannot read a message from the server ({exc})"
            self._ws.close(CloseCode.PROTOCOL_ERROR, "unreadable message")
        self._end(failure)

    def _receive(self, text: str | bytes) -> None:
        for message in decode_frame(text):
            if is_push(message):
                self._route(read_push(message))
                continue
            with self._lock:
                pending = self._pending.pop(message["id"], None)
            if pending is None:  # its caller stopped waiting (timeout)
                continue
            if pending.direct:
                pending.reply.set_result(message)
            else:
                self._events.put(partial(pending.reply.set_result, message))

    def _route(self, push: Push) -> None:
        with self._lock:
            stream = (self._queries if push.kind == "diff" else self._feeds).get(push.name)
        if stream is None:  # an interest being closed
            return
        entries = stream.apply(push) if isinstance(stream, QueryState) else stream.entries()
        if entries:
            self._events.put(partial(stream.notify, push, entries))

    def _dispatch(self) -> None:
        while (event := self._events.get()) is not None:
            event()

    def _end(self, failure: str) -> None:
        """The connection is gone: fail what waits, end the queries, stop the dispatcher."""
        with self._lock:
            self._failure = failure
            pending, self._pending = list(self._pending.values()), {}
            queries, self._queries = list(self._queries.values()), {}
        for request in pending:
            request.reply.set_exception(ConnectionClosedError(failure))
        for state in queries:
            self._events.put(partial(state.finish, None if self._closing else failure))
        self._events.put(None)

    def _uninterest(self, state: QueryState) -> None:
        with self._lock:
            if self._queries.get(state.name) is not state:
                return
            del self._queries[state.name]
        try:
            self.request("uninterest", name=state.name)
        except ConnectionClosedError:
            pass  # the server drops the interests of a departed client
        finally:
            state.finish(None)

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the connection (the server drops this client's interests); every query
        handle ends. Waits for the reader and dispatcher unless called by a subscriber."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._ws.close()
        if threading.current_thread() not in (self._reader, self._dispatcher):
            self._reader.join()
            self._dispatcher.join()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<factflow.client.Client {self.url} {self._failure or 'open'}>"


class RemoteQuery(QueryHandle):
    """A query this client is interested in: its result, assembled from the pushed diffs,
    and its stream of changes (subscribers are called on the dispatcher thread). Close it,
    or use it as a context manager, to uninterest."""

    def __init__(self, client: Client, state: QueryState):
        super().__init__(state)
        self._client = client

    def updates(self, initial: bool = False) -> "Updates":
        """The later diffs as a blocking iterator of ``(epoch, changes)``; with ``initial``,
        the first item is the current result as one diff at :attr:`epoch`."""
        self._state.check()
        return Updates(self._state, initial)

    def explain(self) -> str:
        """The plan of the query on the server."""
        self._state.check()
        return self._client.explain(self.name)

    def close(self) -> None:
        """Uninterest (the server tears the dataflow down when no client is left in it)."""
        self._client._uninterest(self._state)

    def __enter__(self) -> "RemoteQuery":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Updates(UpdatesBase):
    """A query's diffs as a blocking iterator of ``(epoch, [(row, diff), ...])``, from the
    moment it was made (see :meth:`RemoteQuery.updates`). It stops when the query or the
    client is closed, and raises :class:`~factflow.errors.ConnectionClosedError` when the
    connection is lost."""

    def __init__(self, state: QueryState, initial: bool):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        super().__init__(state, initial)

    def _put(self, item) -> None:
        self._queue.put(item)

    def __iter__(self) -> Iterator[tuple[int, list]]:
        return self

    def __next__(self) -> tuple[int, list]:
        while True:
            try:
                return self._item(self._queue.get(timeout=_SIGNAL_SLICE), StopIteration)
            except queue.Empty:
                continue
