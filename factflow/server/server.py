"""The factflow server: one engine, many clients over WebSocket.

Each connection is served by one coroutine that reads its frames and handles its
requests in the order sent, and one writer task that sends its :class:`Outbox` (replies
and pushed changes, in the order they were produced). Requests that read or change the
engine go to the command thread (:mod:`factflow.server.worker`), which runs them in one
total order and groups concurrent transactions into epochs; ``hello`` and ``shutdown``
are answered on the event loop. See docs/protocol.md for the protocol.

Security: the server binds 127.0.0.1 unless told otherwise, and refuses any other
address without a token. With a token, every op but ``hello`` needs a connection that
presented it (in ``hello`` or as an ``Authorization: Bearer`` header), and ``shutdown``
needs it too; without one, ``shutdown`` is accepted from loopback only. With tenants
(:mod:`factflow.server.tenants`, ``--tenants FILE``) the token a connection presents names
its tenant and role: an admin may do everything, a tenant only what that module lists,
checked here (the op) and on the command thread (what a transaction writes) before
anything runs. When a tenant's last connection closes, the server retracts its parameter
facts in an epoch of its own (unless a connection of it said ``"keep": true``).

The console (:mod:`factflow.console`): plain HTTP requests on the same port (``GET /``)
get the console's pages, behind the same token or tenants' tokens; the page is a client
of the protocol, whose read-only ops it reads (``clients`` is answered here, on the event
loop: it reads the connections' outboxes).

Stopping (:meth:`Server.stop`, SIGINT/SIGTERM under :func:`serve`): stop accepting, let
the running command finish (an epoch is never cut short), refuse queued commands, send
every client what is queued for it, close each connection with 1001 (going away), and
close the engine if the server opened it.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import itertools
import logging
import signal
import threading
import time
from typing import Any, Callable

from websockets.asyncio.server import ServerConnection, serve as ws_serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request as HttpRequest, Response

from factflow.console.pages import Pages

from factflow.engine.engine import Engine
from factflow.errors import FactflowError
from factflow.server.handoff import Handoff
from factflow.server.interests import Interests, Listener
from factflow.server.outbox import Outbox
from factflow.server.protocol import PROTOCOL_VERSION, ProtocolError, Request, encode, parse_frame, reply_error, reply_ok
from factflow.server.tenants import TENANT_OPS, Tenant, Tenants
from factflow.server.worker import Command, Worker

__all__ = ["Server", "ServerConfig", "ServerThread", "ServerStartError", "serve", "LOOPBACK_HOSTS"]

log = logging.getLogger("factflow.server")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
_CLIENT_IDS = itertools.count(1)


class ServerStartError(FactflowError):
    """The server cannot start as asked (for example an exposed address without a token)."""


def _check_exposure(host: str, token: str | None, tenants: Tenants | None = None) -> None:
    if host not in LOOPBACK_HOSTS and not token and tenants is None:
        raise ServerStartError(f"refusing to serve on {host} without a token: anyone who can reach it could "
                               f"change the data; give --token-file or --tenants (or bind 127.0.0.1)")


class ServerConfig:
    """Limits of a server: ``max_frame_bytes`` (a larger frame closes the connection with
    1009), ``max_waiting_rows`` (change rows waiting for a slow client before it is
    dropped with 1008), ``chunk_wait`` (seconds the command thread waits, per chunk of a
    large epoch or result, for a client to have room for it before pushing it anyway,
    see :mod:`factflow.server.interests`)."""

    def __init__(self, max_frame_bytes: int = 16 * 1024 * 1024, max_waiting_rows: int = 1_000_000,
                 chunk_wait: float = 30.0):
        self.max_frame_bytes = max_frame_bytes
        self.max_waiting_rows = max_waiting_rows
        self.chunk_wait = chunk_wait


class _Connection:
    """One connected client: its socket, outbox, listener (with the tenant its token named),
    whether it presented a valid token, and whether it asked to keep its tenant's parameters."""

    def __init__(self, ws: ServerConnection, max_waiting_rows: int, on_overflow: Callable[["_Connection"], None]):
        self.ws = ws
        self.outbox = Outbox(max_waiting_rows, on_overflow=lambda: on_overflow(self))
        self.listener = Listener(f"c{next(_CLIENT_IDS)}")
        self.authenticated = False
        self.keep = False
        self.writer: asyncio.Task | None = None
        self.since = time.time()

    @property
    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.ws.remote_address[0]).is_loopback
        except (TypeError, ValueError, IndexError):
            return False


class Server:
    """Serves one engine to WebSocket clients; run it with :meth:`run` on an event loop."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 6262, token: str | None = None,
                 config: ServerConfig | None = None, owns_engine: bool = False, tenants: Tenants | None = None):
        _check_exposure(host, token, tenants)
        self.engine = engine
        self.host = host
        self.port = port
        self.token = token
        self.tenants = tenants
        self.config = config or ServerConfig()
        self.owns_engine = owns_engine
        self._connections: dict[str, _Connection] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._handoff = Handoff(self._deliver)
        self.interests = Interests(engine, self._push_threadsafe)
        self.worker = Worker(engine, self.interests, self._done_threadsafe, lambda: len(self._connections),
                             self._tenant_status, lambda: [c.listener for c in list(self._connections.values())],
                             after_command=self._handoff.flush)
        self.pages = Pages(lambda token: self._identify(token)[0], secured=token is not None or tenants is not None)
        self.url: str | None = None

    # ------------------------------------------------------------ running
    async def run(self, ready: Callable[[str], None] | None = None) -> None:
        """Serve until :meth:`stop` is called; ``ready(url)`` is called once clients can connect."""
        self._loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        self._handoff.bind(self._loop, self.worker.thread)
        self.worker.start()
        async with ws_serve(self._serve_connection, self.host, self.port, max_size=self.config.max_frame_bytes,
                            max_queue=16, logger=logging.getLogger("factflow.server.websockets"),
                            process_request=self._http) as server:
            port = server.sockets[0].getsockname()[1]
            shown = f"[{self.host}]" if ":" in self.host else self.host
            self.url = f"ws://{shown}:{port}/"
            self.pages.bind(port)
            log.info("serving %s (console: %s)", self.url, self.console_url)
            if ready is not None:
                ready(self.url)
            await self._stop_requested.wait()
            server.close(close_connections=False)  # stop accepting
            await asyncio.to_thread(self.worker.stop)  # the running command finishes, queued ones are refused
            await asyncio.gather(*(self._farewell(c) for c in list(self._connections.values())),
                                 return_exceptions=True)
            await server.wait_closed()
        await asyncio.to_thread(self.interests.release_all)  # the worker and every connection are done
        if self.owns_engine:
            await asyncio.to_thread(self.engine.close)

    @property
    def console_url(self) -> str | None:
        """The console's ``http://`` address (None until the server listens)."""
        return "http" + self.url[2:] if self.url is not None else None

    def stop(self) -> None:
        """Ask the server to stop (from any thread)."""
        if self._loop is not None and self._stop_requested is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop_requested.set)

    async def _farewell(self, connection: _Connection) -> None:
        connection.outbox.close()
        if connection.writer is not None:
            await connection.writer
        await connection.ws.close(1001, "the server is shutting down")

    # ------------------------------------------------------------ one connection
    async def _serve_connection(self, ws: ServerConnection) -> None:
        connection = _Connection(ws, self.config.max_waiting_rows, self._drop_slow)
        if self.token is None and self.tenants is None:
            connection.authenticated = True
        else:
            self._admit(connection, self._bearer(ws) or self.pages.session_token(ws.request))
        self._connections[connection.listener.client_id] = connection
        connection.writer = asyncio.create_task(self._write(connection))
        try:
            async for frame in ws:
                if isinstance(frame, bytes):
                    connection.outbox.reply(reply_error(None, "unsupported",
                                                        "binary frames are not supported: send UTF-8 JSON text"))
                    continue
                try:
                    requests = parse_frame(frame)
                except ProtocolError as exc:
                    connection.outbox.reply(reply_error(None, exc.category, str(exc)))
                    continue
                for request in requests:
                    if isinstance(request, ProtocolError):
                        connection.outbox.reply(reply_error(request.request_id, request.category, str(request)))
                    else:
                        await self._handle(connection, request)
        except ConnectionClosed:
            pass
        finally:
            del self._connections[connection.listener.client_id]
            connection.outbox.close()
            self.worker.submit(Command("release", {}, connection.listener))
            tenant = connection.listener.tenant
            if connection.listener.restricted and not connection.keep and not any(
                    c.listener.tenant == tenant for c in self._connections.values()):
                self.worker.submit(Command("retract-parameters", {"entity": tenant.entity}, connection.listener))
            if connection.writer is not None and not connection.writer.done():
                connection.writer.cancel()

    async def _handle(self, connection: _Connection, request: Request) -> None:
        if request.op == "hello":
            self._hello(connection, request)
            return
        if not connection.authenticated:
            connection.outbox.reply(reply_error(request.id, "forbidden", "send hello with the server's token first"))
            return
        refusal = self._refusal(connection, request)
        if refusal is not None:
            connection.outbox.reply(reply_error(request.id, "forbidden", refusal))
            return
        if request.op == "clients":
            connection.outbox.reply(reply_ok(request.id, self._clients()))
            return
        if request.op == "shutdown":
            if self.token is None and self.tenants is None and not connection.loopback:
                connection.outbox.reply(reply_error(request.id, "forbidden", "shutdown is accepted from loopback only"))
                return
            connection.outbox.reply(reply_ok(request.id, {}))
            self.stop()
            return
        finished = asyncio.get_running_loop().create_future()
        self.worker.submit(Command(request.op, request.fields, connection.listener,
                                   context=(connection, request, finished)))
        await finished

    def _hello(self, connection: _Connection, request: Request) -> None:
        version = request.fields["protocol"]
        if version != PROTOCOL_VERSION:
            connection.outbox.reply(reply_error(request.id, "unsupported",
                                                f"protocol {version} is not supported; this server speaks {PROTOCOL_VERSION}"))
            return
        if not connection.authenticated:
            self._admit(connection, request.fields.get("token"))
            if not connection.authenticated:
                connection.outbox.reply(reply_error(request.id, "forbidden", "wrong or missing token"))
                return
        connection.keep = connection.keep or bool(request.fields.get("keep"))
        result = {"protocol": PROTOCOL_VERSION, "client": connection.listener.client_id, "epoch": self.engine.epoch}
        tenant = connection.listener.tenant
        if tenant is not None:
            result.update(tenant=tenant.name, role=tenant.role)
            if tenant.entity is not None:
                result["entity"] = tenant.entity
        connection.outbox.reply(reply_ok(request.id, result))

    def _refusal(self, connection: _Connection, request: Request) -> str | None:
        """Why a tenant may not send ``request`` (None: it may, as far as the op goes; what a
        transaction writes is checked on the command thread)."""
        if not connection.listener.restricted:
            return None
        tenant = connection.listener.tenant.name
        if request.op not in TENANT_OPS:
            return f"tenant {tenant} may not {request.op}: tenants may only " + ", ".join(sorted(TENANT_OPS))
        if request.op == "interest" and set(request.fields) - {"name", "granularity"}:
            return (f"tenant {tenant} joins queries an admin published, by name alone: no query text, inputs, join "
                    "or durable")
        return None

    async def _write(self, connection: _Connection) -> None:
        while (message := await connection.outbox.next()) is not None:
            try:
                await connection.ws.send(encode(message))
            except ConnectionClosed:
                return

    def _drop_slow(self, connection: _Connection) -> None:
        """Disconnect a client whose outbox overflowed (its writer may be stuck in a send)."""
        rows = connection.outbox.max_rows
        log.warning("client %s dropped: more than %d change rows waiting", connection.listener.client_id, rows)
        connection.outbox.close()
        if connection.writer is not None and not connection.writer.done():
            connection.writer.cancel()
        asyncio.ensure_future(connection.ws.close(1008, f"too slow: more than {rows} change rows waiting"))

    # ------------------------------------------------------------ from the command thread
    def _push_threadsafe(self, listener: Listener, kind: str, name: str, epoch: int, changes: list,
                         first: bool, paced: bool) -> None:
        if not paced:
            self._handoff.send("push", listener.client_id, kind, name, epoch, changes, first)
            return
        self._handoff.flush()  # what waits goes first
        wait = self.config.chunk_wait
        pushed = asyncio.run_coroutine_threadsafe(
            self._push_paced(listener.client_id, kind, name, epoch, changes, first, wait), self._loop)
        try:
            pushed.result(wait + 5)
        except Exception:  # noqa: BLE001 - a stopping loop: the client goes with it
            pushed.cancel()

    def _deliver(self, items: list[tuple]) -> None:
        """Queue handed-over pushes and replies in order (see :mod:`factflow.server.handoff`),
        then wake the writers: those of connections that got a reply first, then those of
        connections that got changes only.

        Each connection's own order is its queue's, so a replying client still receives its
        diffs of the epoch before the reply (read your writes). Across connections, the
        replies go out first: a transaction's reply does not wait for the epoch's diffs to
        be encoded and sent to every other client (1,200 of them took the event loop about
        0.3 s), which keeps a writer's latency flat however many clients watch; those diffs
        are queued before the reply and sent right after it."""
        replied: dict[Outbox, None] = {}  # insertion-ordered sets
        changed: dict[Outbox, None] = {}
        for kind, *fields in items:
            if kind == "done":
                replied[self._done(*fields)] = None
            elif (outbox := self._push(*fields, wake=False)) is not None:
                changed[outbox] = None
        for outbox in [*replied, *(o for o in changed if o not in replied)]:
            outbox.wake()

    def _push(self, client_id: str, kind: str, name: str, epoch: int, changes: list, first: bool,
              wake: bool = True) -> Outbox | None:
        connection = self._connections.get(client_id)
        if connection is None:
            return None
        connection.outbox.changes(kind, name, epoch, changes, always=first, wake=wake)
        return connection.outbox

    async def _push_paced(self, client_id: str, kind: str, name: str, epoch: int, changes: list, first: bool,
                          wait: float) -> None:
        """Push once the client's outbox has room for ``changes`` (or after ``wait`` seconds)."""
        connection = self._connections.get(client_id)
        if connection is not None:
            await connection.outbox.room(len(changes), wait)
        self._push(client_id, kind, name, epoch, changes, first)

    def _done_threadsafe(self, command: Command, result: Any, error: ProtocolError | None) -> None:
        if command.context is not None:
            self._handoff.send("done", command, result, error)

    def _done(self, command: Command, result: Any, error: ProtocolError | None) -> Outbox:
        """Queue the reply to ``command`` without waking the writer (:meth:`_deliver` does);
        its outbox."""
        connection, request, finished = command.context
        if error is None:
            if request.op == "interest":  # before any later epoch's diff is pushed
                connection.outbox.set_granularity(result["name"], request.fields.get("granularity"))
            elif request.op in ("uninterest", "drop"):
                connection.outbox.forget(request.fields["name"])
            connection.outbox.reply(reply_ok(request.id, result), wake=False)
        else:
            connection.outbox.reply(reply_error(request.id, error.category, str(error)), wake=False)
        if not finished.done():
            finished.set_result(None)
        return connection.outbox

    # ------------------------------------------------------------ the console
    def _http(self, ws: ServerConnection, request: HttpRequest) -> Response | None:
        """A plain HTTP request gets the console (a WebSocket handshake goes on)."""
        return None if Pages.is_websocket(request) else self.pages.respond(request)

    def _clients(self) -> dict[str, Any]:
        """The ``clients`` op: every connection with its tenant, interests, subscriptions and
        what waits for it (change rows and messages in its outbox, bytes in its socket's buffer)."""
        clients = []
        for connection in list(self._connections.values()):
            listener, tenant = connection.listener, connection.listener.tenant
            transport = connection.ws.transport
            address = connection.ws.remote_address
            clients.append({
                "client": listener.client_id, "tenant": tenant.name if tenant else None,
                "role": tenant.role if tenant else None,
                "address": f"{address[0]}:{address[1]}" if address else None, "since": connection.since,
                "queries": sorted(listener.queries.copy()), "attributes": sorted(listener.attributes.copy()),
                "waiting_rows": connection.outbox.waiting_rows, "waiting_messages": len(connection.outbox.pending()),
                "buffered_bytes": transport.get_write_buffer_size() if transport is not None else 0})
        return {"epoch": self.engine.epoch, "clients": clients, "tenants": self._tenant_status()}

    # ------------------------------------------------------------ tokens and tenants
    def _identify(self, presented: Any) -> tuple[bool, Tenant | None]:
        """Whether a presented token admits a connection, and as which tenant: the server's
        token (an admin, when tenants are configured too) or a tenant's."""
        if self.token is not None and isinstance(presented, str) and hmac.compare_digest(
                presented.encode(), self.token.encode()):
            return True, Tenant("token", "admin") if self.tenants is not None else None
        tenant = self.tenants.authenticate(presented) if self.tenants is not None else None
        return tenant is not None, tenant

    def _admit(self, connection: _Connection, presented: Any) -> None:
        """Authenticate ``connection`` by the token it presented (see :meth:`_identify`)."""
        admitted, tenant = self._identify(presented)
        if admitted:
            connection.authenticated = True
            connection.listener.tenant = tenant

    @staticmethod
    def _bearer(ws: ServerConnection) -> str | None:
        header = ws.request.headers.get("Authorization", "") if ws.request is not None else ""
        scheme, _, value = header.partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None

    def _tenant_status(self) -> dict[str, dict]:
        """Per tenant: its role, entity and open connections (for an admin's ``status``)."""
        if self.tenants is None:
            return {}
        connections = [c.listener.tenant for c in list(self._connections.values())]
        return {name: {"role": t.role, "entity": t.entity, "connections": connections.count(t)}
                for name, t in self.tenants.by_name.items()}


class ServerThread:
    """A server on a background thread (for tests and embedding): ``with ServerThread(engine) as s: s.url``.

    Binds a free port on 127.0.0.1 unless ``port`` is given; the engine stays the caller's.
    """

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 config: ServerConfig | None = None, tenants: Tenants | None = None):
        self.server = Server(engine, host, port, token, config, tenants=tenants)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="factflow-server", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self.server.run(ready=lambda url: self._ready.set()))
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            self._error = exc
            self._ready.set()

    @property
    def url(self) -> str:
        """The server's ``ws://`` address."""
        return self.server.url

    @property
    def console_url(self) -> str:
        """The console's ``http://`` address."""
        return self.server.console_url

    def start(self) -> "ServerThread":
        """Start and wait until clients can connect."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise ServerStartError(f"the server did not start: {self._error}") from self._error
        return self

    def stop(self) -> None:
        """Stop the server and wait for it."""
        self.server.stop()
        self._thread.join()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(host: str = "127.0.0.1", port: int = 6262, master: str | None = None, token: str | None = None,
          state_dir: str | None = None, config: ServerConfig | None = None,
          announce: Callable[[str], None] = print, storage_options: dict[str, str] | None = None,
          tenants: Tenants | None = None) -> int:
    """Run a server in the foreground until SIGINT/SIGTERM or a ``shutdown`` request; returns 0.

    ``announce`` receives the line ``factflow serving ws://HOST:PORT`` once clients can connect,
    then ``factflow console http://HOST:PORT/``.
    ``state_dir`` and ``storage_options`` are the engine's (a path or an object store URI);
    ``tenants`` who may connect and what each may do (:mod:`factflow.server.tenants`).
    """
    _check_exposure(host, token, tenants)
    engine = Engine(master=master, state_dir=state_dir, storage_options=storage_options)
    server = Server(engine, host, port, token, config, owns_engine=True, tenants=tenants)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, server.stop)
        def ready(url: str) -> None:
            announce(f"factflow serving {url.rstrip('/')}")
            announce(f"factflow console {server.console_url}")

        await server.run(ready=ready)

    try:
        asyncio.run(main())
    except OSError as exc:
        engine.close()
        raise ServerStartError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from exc
    return 0
