"""The command thread: every request that reads or changes the engine, in one total order.

Client connections (on the event loop) submit :class:`Command` objects; one thread takes
them first come, first served and runs them against the engine, so every client sees
one order of commands and of epochs. Spark calls block, which is why this is a thread
and not a coroutine: the event loop keeps reading, replying and pushing meanwhile.

Group commit: when the thread is free, it takes every transaction waiting at the front
of the queue at once and applies them with :meth:`factflow.Engine.transact_many` (one
epoch for all that are compatible, each validated on its own); transactions that arrive
while an epoch runs therefore land together in the next one. Interests are admitted the
same way: those waiting together are taken together, and the parameter facts of those
whose constants the server lifts (:mod:`factflow.server.lifting`) are written in one
epoch for all of them.

A command's outcome reaches its client through ``done(command, result, error)``, which
the server turns into a reply queued behind the diffs the command's epoch pushed.
"""

from __future__ import annotations

import datetime as _dt
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from factflow.engine.engine import Engine
from factflow.errors import EdnSyntaxError, EngineClosedError, QueryError, SchemaError, TransactionError
from factflow.server.interests import Interests, Listener
from factflow.server.protocol import PROTOCOL_VERSION, ProtocolError
from factflow.server.lifting import LIFT_PREFIX, touches_lifted_parameters
from factflow.server.tenants import check_tenant_transaction
from factflow.server.views import Views

__all__ = ["Command", "Worker", "LINGER_QUIET", "LINGER_MAX"]

#: Group commit: how long the queue must stay quiet before a transaction group is taken,
#: and the longest the command thread lingers for it (seconds).
LINGER_QUIET = 0.002
LINGER_MAX = 0.02
#: The ops taken together when several wait (see :meth:`Worker._take`).
_GROUPED = ("transact", "interest")

log = logging.getLogger("factflow.server")


@dataclass
class Command:
    """One request of one client (or the server's own ``release`` of a departed client)."""

    op: str
    fields: dict[str, Any]
    listener: Listener
    context: Any = None  # what the server needs to reply (the request id and connection), opaque here


Done = Callable[[Command, Any, ProtocolError | None], None]


class Worker:
    """Runs commands one at a time (transactions grouped) on a thread of its own;
    ``after_command`` is called on that thread once each command (or group) is done."""

    def __init__(self, engine: Engine, interests: Interests, done: Done, client_count: Callable[[], int],
                 tenants: Callable[[], dict[str, dict]] = dict, listeners: Callable[[], list[Listener]] = list,
                 after_command: Callable[[], None] = lambda: None):
        self.engine = engine
        self.interests = interests
        self._done = done
        self._client_count = client_count
        self._tenants = tenants
        self.views = Views(engine, interests, listeners)
        self._queue: deque[Command] = deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._after_command = after_command
        self._thread = threading.Thread(target=self._run, name="factflow-commands", daemon=True)
        self.transactions = 0  # committed by the command thread (for status)
        self.epochs = 0

    @property
    def thread(self) -> threading.Thread:
        """The command thread."""
        return self._thread

    def start(self) -> None:
        """Start taking commands."""
        self._thread.start()

    def submit(self, command: Command) -> None:
        """Queue a command; refused with an error once the server is stopping."""
        with self._wake:
            if not self._stopping:
                self._queue.append(command)
                self._wake.notify()
                return
        self._done(command, None, ProtocolError("unsupported", "the server is shutting down"))

    def stop(self, timeout: float | None = None) -> None:
        """Finish the running command, refuse what waits, and end the thread."""
        with self._wake:
            self._stopping = True
            waiting = list(self._queue)
            self._queue.clear()
            self._wake.notify()
        for command in waiting:  # departing clients' releases included: the server releases everything at the end
            self._done(command, None, ProtocolError("unsupported", "the server is shutting down"))
        self._thread.join(timeout)

    # ------------------------------------------------------------ the thread
    def _take(self) -> list[Command] | None:
        """The next command, or every queued transaction (interest) at once when one is first.

        Transactions and interests are taken from anywhere in the queue: a connection has
        at most one request in flight, so queued commands come from different clients, and
        running them before the others queued among them is a valid total order that keeps
        each client's own. When the first is a transaction, the thread lingers until
        the queue has been quiet for ``LINGER_QUIET`` seconds (at most ``LINGER_MAX``), so
        that clients answered by the previous epoch join this one rather than the next.
        """
        with self._wake:
            while not self._queue and not self._stopping:
                self._wake.wait()
            if not self._queue:
                return None
            grouped = self._queue[0].op
            if grouped == "transact" and not self._stopping:
                deadline = time.monotonic() + LINGER_MAX
                while time.monotonic() < deadline:
                    size = len(self._queue)
                    self._wake.wait(min(LINGER_QUIET, max(deadline - time.monotonic(), 0)))
                    if len(self._queue) == size:
                        break
            first = self._queue.popleft()
            if first.op not in _GROUPED:
                return [first]
            taken = [first] + [c for c in self._queue if c.op == grouped]
            others = [c for c in self._queue if c.op != grouped]
            self._queue.clear()
            self._queue.extend(others)
            return taken

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            try:
                if taken[0].op == "transact":
                    self._transact(taken)
                elif taken[0].op == "interest":
                    self._admit(taken)
                else:
                    self._execute(taken[0])
            finally:
                self._after_command()

    def _transact(self, commands: list[Command]) -> None:
        transactions = []
        for command in commands:
            try:
                if command.listener.restricted:  # a tenant writes only its own parameters; checked before anything runs
                    check_tenant_transaction(command.listener.tenant, command.fields["tx"], self.engine.schema)
                elif touches_lifted_parameters(command.fields["tx"]):
                    raise ProtocolError("forbidden", f"attributes under {LIFT_PREFIX} are the server's own "
                                                     "(lifted constants of shared queries); clients may not write them")
                transactions.append(self._json_instants(command.fields["tx"]))
            except ProtocolError as exc:
                transactions.append(exc)
        ready = [t for t in transactions if not isinstance(t, ProtocolError)]
        try:
            outcomes = iter(self.engine.transact_many(ready))
        except Exception as exc:  # noqa: BLE001 - every command must get its reply
            error = _as_protocol_error(exc)
            for command in commands:
                self._done(command, None, error)
            return
        epochs = set()
        for command, tx in zip(commands, transactions):
            outcome = tx if isinstance(tx, ProtocolError) else next(outcomes)
            if isinstance(outcome, Exception):
                self._done(command, None, _as_protocol_error(outcome))
            else:
                epochs.add(outcome)
                self.transactions += 1
                self._done(command, {"epoch": outcome}, None)
        self.epochs += len(epochs)

    def _admit(self, commands: list[Command]) -> None:
        """Interests taken together: each joined on its own, then the lifted ones' parameter
        facts written in one epoch, then every reply."""
        outcomes = []
        for command in commands:
            try:
                outcomes.append((self._op_interest(command.listener, **command.fields), None))
            except Exception as exc:  # noqa: BLE001 - every command must get its reply
                outcomes.append((None, _as_protocol_error(exc)))
        try:
            self.interests.settle()
        except Exception as exc:  # noqa: BLE001 - the lifted interests of this group fail with it
            error = _as_protocol_error(exc)
            for command, (result, _) in zip(commands, outcomes):
                if result is not None and "lifted" in result:
                    self.interests.uninterest(command.listener, result["name"])
            outcomes = [(None, error) if r is not None and "lifted" in r else (r, e) for r, e in outcomes]
        for command, (result, error) in zip(commands, outcomes):
            self._done(command, result, error)

    def _execute(self, command: Command) -> None:
        try:
            result = getattr(self, "_op_" + command.op.replace("-", "_"))(command.listener, **command.fields)
        except Exception as exc:  # noqa: BLE001 - every command must get its reply
            self._done(command, None, _as_protocol_error(exc))
            return
        self._done(command, result, None)

    # ------------------------------------------------------------ the ops
    def _op_create_attribute(self, listener: Listener, name: str, type: str = "string",
                             semantics: str = "set", index: str = "both", support: str = "wco",
                             slack: int = 0, parameter: bool = False) -> dict:
        try:
            existing = self.engine.schema.get(name)
        except SchemaError:
            existing = None
        try:
            attribute = self.engine.create_attribute(name, type=type, semantics=semantics, index=index,
                                                     support=support, slack=slack, parameter=parameter)
        except SchemaError as exc:  # redefining an existing attribute otherwise is a conflict, not bad input
            raise ProtocolError("conflict" if existing is not None else "incorrect", str(exc)) from None
        if attribute.parameter:
            self.interests.follow_parameter(str(attribute.name))
        return {"name": str(attribute.name), "type": attribute.value_type, "semantics": attribute.semantics,
                **attribute.settings}

    def _op_register(self, listener: Listener, rules: str) -> dict:
        return {"rules": self.engine.register(rules)}

    def _op_interest(self, listener: Listener, query: str | None = None, name: str | None = None,
                     inputs: list | None = None, join: str = "auto", granularity: float | None = None,
                     durable: bool = False) -> dict:
        # the granularity is the connection's business (its outbox holds diffs back)
        if query is None:
            if name is None:
                raise ProtocolError("incorrect", "interest: give the query's text, or the name of a published query")
            installed, columns = self.interests.join(listener, name)
            return {"epoch": self.engine.epoch, "columns": columns, "name": name, "durable": installed.durable}
        joined = self.interests.interest(listener, name, query, list(inputs or []), join, durable)
        reply = {"epoch": self.engine.epoch, "columns": joined.columns, "name": joined.name, "durable": joined.durable}
        if joined.lifted is not None:
            reply["lifted"] = joined.lifted
        return reply

    def _op_publish(self, listener: Listener, name: str, query: str, inputs: list | None = None,
                    join: str = "auto", tenant: str | None = None) -> dict:
        installed, created = self.interests.publish(name, query, list(inputs or []), join, tenant)
        columns = installed.columns if tenant is None else [c for c in installed.columns if c != tenant]
        return {"name": name, "epoch": self.engine.epoch, "tenant": tenant, "columns": columns,
                "created": created, "durable": installed.durable}

    def _op_uninterest(self, listener: Listener, name: str) -> dict:
        self.interests.uninterest(listener, name)
        return {}

    def _op_drop(self, listener: Listener, name: str) -> dict:
        self.interests.drop(listener, name)
        return {}

    def _op_subscribe(self, listener: Listener, attribute: str) -> dict:
        self.interests.subscribe(listener, attribute)
        return {"epoch": self.engine.epoch}

    def _op_unsubscribe(self, listener: Listener, attribute: str) -> dict:
        self.interests.unsubscribe(listener, attribute)
        return {}

    def _op_query(self, listener: Listener, query: str, inputs: list | None = None) -> dict:
        installed = self.engine.query(query, inputs=list(inputs or []))
        try:
            rows = [list(row) for row, n in installed.rows().items() for _ in range(max(n, 0))]
            return {"rows": rows, "columns": installed.columns, "epoch": self.engine.epoch}
        finally:
            installed.close()

    def _op_explain(self, listener: Listener, name: str) -> dict:
        return {"text": self.interests.explain(listener, name)}

    def _op_status(self, listener: Listener) -> dict:
        if listener.restricted:  # a tenant sees its own interests only
            return {"protocol": PROTOCOL_VERSION, "epoch": self.engine.epoch, "tenant": listener.tenant.name,
                    "queries": {name: 1 for name in sorted(listener.queries)}}
        return {"protocol": PROTOCOL_VERSION, "epoch": self.engine.epoch, "clients": self._client_count(),
                "queries": self.interests.counts(), "dataflows": len(self.engine.queries),
                "published": self.interests.published(), "tenants": self._tenants(),
                "group_commit": {"transactions": self.transactions, "epochs": self.epochs},
                "stats": self.engine.stats()}

    def _op_epochs(self, listener: Listener, since: int | None = None, limit: int = 200) -> dict:
        return self.views.epochs(since, limit)

    def _op_queries(self, listener: Listener) -> dict:
        return self.views.queries(listener)

    def _op_plan(self, listener: Listener, name: str) -> dict:
        return self.views.plan(name)

    def _op_state(self, listener: Listener) -> dict:
        return self.views.state()

    def _op_release(self, listener: Listener) -> None:
        self.interests.release(listener)

    def _op_retract_parameters(self, listener: Listener, entity: int) -> dict:
        """The server's own command when a tenant's last connection closed: retract every
        parameter fact of its entity, in an epoch of its own."""
        operations = self.interests.parameter_retractions(entity)
        return {"epoch": self.engine.transact(operations) if operations else self.engine.epoch}

    # ------------------------------------------------------------ helpers
    def _json_instants(self, tx: Any) -> Any:
        """JSON operation lists carry instants as ISO-8601 text: parse them for instant attributes."""
        if not isinstance(tx, list):
            return tx
        converted = []
        for position, op in enumerate(tx):
            if isinstance(op, list) and len(op) == 4 and isinstance(op[3], str) and isinstance(op[2], str):
                try:
                    attribute = self.engine.schema.get(op[2])
                except SchemaError:
                    attribute = None
                if attribute is not None and attribute.value_type == "instant":
                    op = [op[0], op[1], op[2], _instant(op[3], position)]
            converted.append(op)
        return converted


def _instant(text: str, position: int) -> _dt.datetime:
    try:
        value = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ProtocolError("incorrect", f"operation {position}: {text!r} is not an ISO-8601 instant") from None
    return value if value.tzinfo else value.replace(tzinfo=_dt.timezone.utc)


def _as_protocol_error(exc: BaseException) -> ProtocolError:
    """The error reply for an exception: bad input is ``incorrect``, our failures are ``fault``."""
    if isinstance(exc, ProtocolError):
        return exc
    if isinstance(exc, (TransactionError, EdnSyntaxError, SchemaError, QueryError)):
        return ProtocolError("incorrect", str(exc))
    if isinstance(exc, EngineClosedError):
        return ProtocolError("unsupported", "the server is shutting down")
    log.error("command failed", exc_info=exc)
    return ProtocolError("fault", f"{type(exc).__name__}: {exc}")

