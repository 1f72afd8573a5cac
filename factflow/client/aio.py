"""The asyncio client: :class:`AsyncClient` and its :class:`AsyncRemoteQuery` handles.

One reader task receives every frame in order: it adds a pushed diff to its query's
result and calls the subscribers (plain functions, on the reader task: they must not
block; to await something per diff, iterate ``query.updates()`` instead), and resolves the
future of the request a reply answers. Since the server sends an epoch's diffs before the
reply to the transaction that made it, ``await client.transact(...)`` returns after this
client's subscribers have seen that epoch (read-your-writes). Requests may be awaited
concurrently from many tasks; replies are matched by id.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, AsyncIterator, Callable, Sequence

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.frames import CloseCode

from factflow.client.messages import (
    PROTOCOL_VERSION, Push, QueryHandle, QueryState, Subscriber, Subscribers, UpdatesBase, as_row, close_description,
    decode_frame, encode_request, identity, interest_request, is_push, read_push, reply_result,
)
from factflow.errors import ConnectionClosedError, RequestTimeoutError, ServerError

__all__ = ["AsyncClient", "AsyncRemoteQuery", "AsyncUpdates"]

log = logging.getLogger("factflow.client")


class _Feed(Subscribers):
    """This client's subscribers to one attribute; ``ready`` settles with the subscribe reply."""

    def __init__(self):
        super().__init__()
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()


class AsyncClient:
    """An asyncio connection to a factflow server: ``client = await AsyncClient.connect(url)``
    or ``async with AsyncClient(url) as client``. The arguments are those of
    :class:`factflow.client.Client`."""

    def __init__(self, url: str, token: str | None = None, timeout: float | None = None,
                 connect_timeout: float = 10.0, keep: bool = False):
        self.url = url
        self.timeout = timeout
        self.client_id: str | None = None
        self.tenant: str | None = None
        self.role: str | None = None
        self.entity: int | None = None
        self._token = token
        self._keep = keep
        self._connect_timeout = connect_timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._queries: dict[str, QueryState] = {}
        self._feeds: dict[str, _Feed] = {}
        self._closing = False
        self._failure: str | None = None
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task | None = None

    @classmethod
    async def connect(cls, url: str, token: str | None = None, timeout: float | None = None,
                      connect_timeout: float = 10.0, keep: bool = False) -> "AsyncClient":
        """Open a connection and say hello."""
        client = cls(url, token, timeout, connect_timeout, keep)
        await client._open()
        return client

    async def _open(self) -> None:
        try:
            self._ws = await connect(self.url, open_timeout=self._connect_timeout, max_size=None)
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError, asyncio.TimeoutError) as exc:
            raise ConnectionClosedError(f"cannot connect to {self.url}: {exc}") from exc
        self._reader = asyncio.create_task(self._read(), name="factflow-client-reader")
        try:
            hello = await self.request("hello", protocol=PROTOCOL_VERSION, token=self._token, keep=self._keep or None)
            self.client_id, self.tenant, self.role, self.entity = identity(hello)
        except BaseException:
            await self.close()
            raise

    # ------------------------------------------------------------ the engine's operations
    async def create_attribute(self, name: str, type: str = "string", semantics: str = "set", index: str = "both",
                               support: str = "wco", slack: int = 0, parameter: bool = False) -> dict[str, str]:
        """Define an attribute (see :meth:`factflow.client.Client.create_attribute`)."""
        return await self.request("create-attribute", name=name, type=type, semantics=semantics, index=index,
                                  support=support, slack=slack, parameter=parameter or None)

    async def transact(self, tx: Sequence[Sequence[Any]] | str) -> int:
        """Apply a transaction (operations or EDN text) as one epoch; returns the epoch, whose
        diffs this client's subscribers have received."""
        return (await self.request("transact", tx=tx if isinstance(tx, str) else [list(op) for op in tx]))["epoch"]

    async def register(self, rules: str) -> list[str]:
        """Store rules (EDN text); returns the names of the rules defined."""
        return (await self.request("register", rules=rules))["rules"]

    async def query(self, query: str | None = None, name: str | None = None, inputs: Sequence[Any] = (),
                    join: str = "auto", granularity: float | None = None,
                    durable: bool = False) -> "AsyncRemoteQuery":
        """Become interested in a query, or join a published one by ``name`` alone; returns
        its handle, holding the current result (see :meth:`factflow.client.Client.query`)."""
        name, fields = interest_request(query, name, inputs, join, granularity, durable)
        if name in self._queries:
            raise ServerError("conflict", f"this client is already interested in a query named {name!r}", "interest")
        state = self._queries[name] = QueryState(name)
        try:
            result = await self.request("interest", **fields)
        except BaseException:
            if self._queries.get(name) is state:
                del self._queries[name]
            raise
        state.begin(result)
        return AsyncRemoteQuery(self, state)

    async def publish(self, name: str, query: str, tenant: str | None = None, inputs: Sequence[Any] = (),
                      join: str = "auto") -> dict[str, Any]:
        """Admin: publish a query for tenants (see :meth:`factflow.client.Client.publish`)."""
        return await self.request("publish", name=name, query=query, tenant=tenant, inputs=list(inputs) or None,
                                  join=join)

    async def q(self, query: str, inputs: Sequence[Any] = ()) -> list[tuple]:
        """A one-shot answer: the rows of ``query`` as of now, as tuples in ``:find`` order."""
        result = await self.request("query", query=query, inputs=list(inputs) or None)
        return [as_row(row) for row in result["rows"]]

    async def subscribe_attribute(self, attribute: str, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn(epoch, [((entity, value), diff), ...])`` for every later change of
        ``attribute``; returns the function that unsubscribes it."""
        self._check_open()
        feed = self._feeds.get(attribute)
        first = feed is None
        if first:
            feed = self._feeds[attribute] = _Feed()
        unsubscribe = feed.add_subscriber(fn)
        if first:
            try:
                await self.request("subscribe", attribute=attribute)
            except BaseException as exc:
                del self._feeds[attribute]
                feed.ready.set_exception(exc)
                feed.ready.exception()  # retrieved: no "never retrieved" warning without a second subscriber
                raise
            feed.ready.set_result(None)
        else:
            await asyncio.shield(feed.ready)  # raises as the first subscription did
        return unsubscribe

    async def explain(self, name: str) -> str:
        """The plan of the installed query ``name`` (any client's)."""
        return (await self.request("explain", name=name))["text"]

    async def drop(self, name: str) -> None:
        """Close the query ``name`` on the server for good (see :meth:`factflow.client.Client.drop`)."""
        await self.request("drop", name=name)
        state = self._queries.pop(name, None)
        if state is not None:
            state.finish(None)

    async def status(self) -> dict[str, Any]:
        """The server's ``epoch``, ``clients``, ``queries`` (name -> interested clients) and ``stats``."""
        return await self.request("status")

    async def shutdown(self) -> None:
        """Ask the server to stop (it then closes every connection, this one too)."""
        await self.request("shutdown")

    # ------------------------------------------------------------ requests
    async def request(self, op: str, **fields: Any) -> Any:
        """Send one request of the protocol (fields that are None are left out) and return the
        ``result`` of its reply; raises :class:`~factflow.errors.ServerError` for an error reply."""
        request_id = next(self._ids)
        text = encode_request(op, request_id, fields)
        self._check_open()
        reply = self._pending[request_id] = asyncio.get_running_loop().create_future()
        try:
            try:
                await self._ws.send(text)
            except ConnectionClosed:
                pass  # the reader fails every waiting request, this one too, saying why
            message = await asyncio.wait_for(reply, self.timeout)
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
            raise RequestTimeoutError(f"{op}: no reply from {self.url} within {self.timeout} s; "
                                      f"the server may still carry the request out") from None
        finally:
            self._pending.pop(request_id, None)
        return reply_result(message, op)

    def _check_open(self) -> None:
        if self._failure is not None:
            raise ConnectionClosedError(self._failure)
        if self._closing or self._ws is None:
            raise ConnectionClosedError("the client is closed" if self._closing else "the client is not connected")

    # ------------------------------------------------------------ the reader
    async def _read(self) -> None:
        try:
            while True:
                self._receive(await self._ws.recv())
        except ConnectionClosed as exc:
            failure = "the client is closed" if self._closing else close_description(self.url, exc)
        except Exception as exc:  # an unreadable message or a bug: fail loudly rather than hang every caller
            log.exception("factflow client: cannot read a message from %s", self.url)
            failure = f"the connection to {self.url} was dropped: cannot read a message from the server ({exc})"
            await self._ws.close(CloseCode.PROTOCOL_ERROR, "unreadable message")
        self._end(failure)

    def _receive(self, text: str | bytes) -> None:
        for message in decode_frame(text):
            if is_push(message):
                self._deliver(read_push(message))
                continue
            reply = self._pending.pop(message["id"], None)
            if reply is not None and not reply.done():  # else its caller stopped waiting
                reply.set_result(message)

    def _deliver(self, push: Push) -> None:
        stream = (self._queries if push.kind == "diff" else self._feeds).get(push.name)
        if stream is None:  # an interest being closed
            return
        stream.notify(push, stream.apply(push) if isinstance(stream, QueryState) else stream.entries())

    def _end(self, failure: str) -> None:
        """The connection is gone: fail what waits and end the queries."""
        self._failure = failure
        pending, self._pending = list(self._pending.values()), {}
        queries, self._queries = list(self._queries.values()), {}
        for reply in pending:
            if not reply.done():
                reply.set_exception(ConnectionClosedError(failure))
        for state in queries:
            state.finish(None if self._closing else failure)

    async def _uninterest(self, state: QueryState) -> None:
        if self._queries.get(state.name) is not state:
            return
        del self._queries[state.name]
        try:
            await self.request("uninterest", name=state.name)
        except ConnectionClosedError:
            pass  # the server drops the interests of a departed client
        finally:
            state.finish(None)

    # ------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        """Close the connection (the server drops this client's interests); every query handle ends."""
        if self._closing or self._ws is None:
            return
        self._closing = True
        await self._ws.close()
        if self._reader is not asyncio.current_task():
            await self._reader

    async def __aenter__(self) -> "AsyncClient":
        if self._ws is None:
            await self._open()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<factflow.client.AsyncClient {self.url} {self._failure or ('open' if self._ws else 'not connected')}>"


class AsyncRemoteQuery(QueryHandle):
    """A query this client is interested in (see :class:`factflow.client.RemoteQuery`);
    subscribers are called on the reader task. Close it, or use it as an async context
    manager, to uninterest."""

    def __init__(self, client: AsyncClient, state: QueryState):
        super().__init__(state)
        self._client = client

    def updates(self, initial: bool = False) -> "AsyncUpdates":
        """The later diffs as an async iterator of ``(epoch, changes)``; with ``initial``, the
        first item is the current result as one diff at :attr:`epoch`."""
        self._state.check()
        return AsyncUpdates(self._state, initial)

    async def explain(self) -> str:
        """The plan of the query on the server."""
        self._state.check()
        return await self._client.explain(self.name)

    async def close(self) -> None:
        """Uninterest (the server tears the dataflow down when no client is left in it)."""
        await self._client._uninterest(self._state)

    async def __aenter__(self) -> "AsyncRemoteQuery":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class AsyncUpdates(UpdatesBase):
    """A query's diffs as an async iterator of ``(epoch, [(row, diff), ...])``, from the
    moment it was made (see :meth:`AsyncRemoteQuery.updates`). It stops when the query or
    the client is closed, and raises :class:`~factflow.errors.ConnectionClosedError` when
    the connection is lost."""

    def __init__(self, state: QueryState, initial: bool):
        self._queue: asyncio.Queue = asyncio.Queue()
        super().__init__(state, initial)

    def _put(self, item) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> AsyncIterator[tuple[int, list]]:
        return self

    async def __anext__(self) -> tuple[int, list]:
        return self._item(await self._queue.get(), StopAsyncIteration)
