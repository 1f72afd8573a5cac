"""Which client listens to what: shared query interests and attribute subscriptions.

An interest names a query. The first client interested under a name installs it in the
engine; a later client naming the same query (one whose plan, see :meth:`Engine.plan
<factflow.engine.engine.Engine.plan>`, has the same fingerprint: the same form, inputs and
join, however the text is spaced) shares that one dataflow; a different query under a
taken name is a conflict. The dataflow is torn down with its last interested client, unless it is durable
(an interest with ``durable``, on a server with a state directory): a durable query stays
installed without clients, is installed again when the server restarts on the same state
directory, and goes only when a client drops it. Every epoch's
changes of a query fan out from one engine subscriber to the outboxes of the clients
interested in it, and an attribute's changes to the clients subscribed to it.

Large results and change sets come in chunks of at most ``EngineConfig.fetch_limit`` rows
(:meth:`Query.chunks`, :meth:`Query.subscribe`), each pushed as a ``diff`` message of its
own with the same epoch. The chunks after an epoch's first are pushed *paced*: the server
waits until a client has room for them (see :class:`factflow.server.server.ServerConfig`),
so that what waits for a client stays bounded while it reads a large epoch.

Queries an admin *published* (:mod:`factflow.server.publication`) stay installed without
clients until dropped; tenants join them by name, and a tenant-routed one's changes are
split by tenant and go only to the tenant they belong to. The registry also follows the
*parameter attributes* (:mod:`factflow.server.tenants`): which parameter facts each tenant
entity holds, so that the server can retract them, without a Spark job, when the
tenant's last connection closes.

An unnamed interest (or one named as clients name unnamed queries, ``q-...``) whose
constants can be lifted (:mod:`factflow.server.lifting`) joins the *family* of its shape:
one dataflow of the lifted query for every such interest, a parameter entity per distinct
tuple of constants (its facts written in an epoch when the first interest in it comes,
retracted when the last one goes), and each interest receives the rows of its entity
under its own name.

Only the command thread (:mod:`factflow.server.worker`) touches this registry.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from factflow.engine.engine import Engine
from factflow.engine.query import Query
from factflow.server.lifting import LIFT_PREFIX, Lifted, lift
from factflow.server.protocol import ProtocolError
from factflow.server.publication import LABEL, Publication, check_publication
from factflow.server.tenants import Tenant, is_tenant_entity
from factflow.text import plural

__all__ = ["Interests", "Listener", "Push", "Joined"]

#: Parameter entities of lifted constants: ``[-2**60, -2**59)``, above the tenants' range.
_LIFT_KEYS = -(2**60)

#: ``push(listener, kind, name, epoch, changes, first, paced)`` queues changes for a client
#: (``paced``: once it has room for them).
Push = Callable[["Listener", str, str, int, list, bool, bool], None]


class Listener:
    """What the registry knows of a client: an id, what it listens to, and who it is (the
    tenant its token named; None on a server without tenants, where every client may do
    everything)."""

    def __init__(self, client_id: str):
        self.client_id = client_id
        self.queries: set[str] = set()
        self.attributes: set[str] = set()
        self.tenant: Tenant | None = None

    @property
    def restricted(self) -> bool:
        """Whether this is a tenant's connection (not an admin's, nor one of a server without tenants)."""
        return self.tenant is not None and not self.tenant.admin


@dataclass(frozen=True)
class Joined:
    """What an interest joined: the name the client receives its changes under, the columns
    it receives, whether the query is durable, and what was lifted (None: nothing)."""

    name: str
    columns: list[str]
    durable: bool = False
    lifted: str | None = None


@dataclass
class _Family:
    """The one dataflow of every lifted interest of one shape (see the module docs)."""

    lifted: Lifted  # the first interest's lifting (the family's text, attributes)
    query: Query
    routes: Publication = field(default_factory=lambda: Publication(0))
    entities: dict[tuple, int] = field(default_factory=dict)  # constants -> parameter entity
    members: dict[int, dict[tuple[str, str], Listener]] = field(default_factory=dict)
    fresh: set[tuple[str, str]] = field(default_factory=set)  # members whose first rows are still to come


@dataclass
class _Shared:
    """One installed query and the clients interested in it."""

    identity: str  # the fingerprint of the query's plan
    query: Query
    listeners: dict[str, Listener] = field(default_factory=dict)
    epoch: int | None = None  # the epoch whose changes were pushed last
    publication: Publication | None = None  # set when an admin published it


class Interests:
    """The registry of shared queries and attribute subscriptions of one server."""

    def __init__(self, engine: Engine, push: Push):
        self.engine = engine
        self._push = push
        self._queries: dict[str, _Shared] = {}
        self._attributes: dict[str, tuple[dict[str, Listener], Callable[[], None]]] = {}
        #: per tenant entity, the parameter facts it holds: Counter of (attribute, value)
        self.parameters: dict[int, Counter] = {}
        self._followed: dict[str, Callable[[], None]] = {}  # parameter attributes followed
        self._families: dict[str, _Family] = {}
        self._lifted: dict[tuple[str, str], tuple[_Family, int, Lifted]] = {}  # (client, name) -> its lifting
        self._keys = itertools.count(_LIFT_KEYS)
        self._unwritten: list[list] = []  # parameter facts of lifted interests admitted, for :meth:`settle`
        self._forget_lifted_parameters()
        for query in engine.queries.values():  # the durable queries a state directory brought back
            if query.durable:
                published = dict(query.definition.labels).get(LABEL)
                self._share(query.plan.fingerprint(), query,
                            Publication(json.loads(published)["column"]) if published is not None else None)
        for attribute in engine.schema:
            if attribute.parameter:
                self.follow_parameter(str(attribute.name))

    def _share(self, identity: str, query: Query, publication: Publication | None = None) -> _Shared:
        shared = self._queries[query.name] = _Shared(identity, query, publication=publication)
        if publication is not None:
            for chunk in query.chunks():
                publication.split(chunk)
        query.subscribe(lambda epoch, changes, s=shared: self._fan_out(s, epoch, changes))
        return shared

    def interest(self, listener: Listener, name: str | None, text: str, inputs: list, join: str,
                 durable: bool = False) -> Joined:
        """Add ``listener`` to the query ``name`` (installing it if new, making it durable if
        asked); pushes its current result as the first change (in chunks when it is large:
        several messages at the same epoch, never folded). Without a name, the query is
        named after its plan's fingerprint, so that every client asking it shares it, and
        its constants are lifted where they can be (joining a family of its shape)."""
        if durable and not self.engine.durable:
            raise ProtocolError("unsupported", "durable interests need a server with a state directory "
                                "(factflow serve --state-dir DIR)")
        published = self._queries.get(name) if name else None
        if published is not None and published.publication is not None:
            raise ProtocolError("conflict", f"{name!r} is a published query: join it by name alone, without query text")
        plan = self.engine.plan(text, inputs=inputs, join=join)
        identity = plan.fingerprint()
        name = name or "q-" + identity[:12]
        if not durable and name.startswith("q-") and name not in self._queries:
            lifted = lift(text, inputs, self.engine.schema)
            if lifted is not None:
                return self._join_family(listener, name, lifted, join)
        shared = self._queries.get(name)
        if shared is None:
            shared = self._share(identity, self.engine.query(plan, name=name, durable=durable))
        elif shared.identity != identity:
            raise ProtocolError("conflict", f"a different query is installed under the name {name!r}")
        elif listener.client_id in shared.listeners:
            raise ProtocolError("conflict", f"already interested in {name!r}")
        elif durable and not shared.query.durable:
            self.engine.query(plan, name=name, durable=True)
        shared.listeners[listener.client_id] = listener
        listener.queries.add(name)
        for number, chunk in enumerate(shared.query.chunks()):
            self._push(listener, "diff", name, self.engine.epoch, chunk, True, number > 0)
        return Joined(name, shared.query.columns, shared.query.durable)

    # ------------------------------------------------------------ lifted constants
    def _join_family(self, listener: Listener, name: str, lifted: Lifted, join: str) -> Joined:
        """Join the family of ``lifted``'s shape under ``name`` with its constants."""
        member = (listener.client_id, name)
        if name in listener.queries:
            raise ProtocolError("conflict", f"already interested in {name!r}")
        family = self._families.get(lifted.family)
        if family is None:
            family = self._install_family(lifted, join)
        key = family.entities.get(lifted.constants)
        new = key is None
        if new:
            key = family.entities[lifted.constants] = next(self._keys)
        family.members.setdefault(key, {})[member] = listener
        listener.queries.add(name)
        self._lifted[member] = (family, key, lifted)
        if new:  # its facts are written by :meth:`settle`, with those of the interests admitted beside it
            family.fresh.add(member)
            self._unwritten += [[":db/add", key, attribute, value]
                                for (attribute, _), value in zip(family.lifted.attributes, lifted.constants)]
        else:
            self._push(listener, "diff", name, self.engine.epoch, family.routes.current(key), True, False)
        return Joined(name, family.query.columns[1:], False, lifted.explain())

    def settle(self) -> None:
        """Write the parameter facts of the lifted interests admitted since the last call, in
        one epoch for all of them (the command thread admits the interests waiting together,
        as it commits transactions), and send each new member whose rows did not come with
        that epoch its (empty) first result."""
        operations, self._unwritten = self._unwritten, []
        if operations:
            self.engine.transact(operations)
        for family in self._families.values():
            for member in list(family.fresh):
                family.fresh.discard(member)
                listener = family.members[self._lifted[member][1]][member]
                self._push(listener, "diff", member[1], self.engine.epoch, [], True, False)

    def _install_family(self, lifted: Lifted, join: str) -> _Family:
        for attribute, value_type in lifted.attributes:
            self.engine.create_attribute(attribute, type=value_type, semantics="one")
        query = self.engine.query(lifted.text, inputs=lifted.inputs, join=join, name=lifted.family)
        family = self._families[lifted.family] = _Family(lifted, query)
        query.subscribe(lambda epoch, changes, f=family: self._fan_out_family(f, epoch, changes))
        return family

    def _leave_family(self, listener: Listener, name: str) -> None:
        family, key, lifted = self._lifted.pop((listener.client_id, name))
        listener.queries.discard(name)
        family.fresh.discard((listener.client_id, name))
        members = family.members.get(key, {})
        members.pop((listener.client_id, name), None)
        if members:
            return
        family.members.pop(key, None)
        del family.entities[lifted.constants]
        self.engine.transact([[":db/retract", key, attribute, value]
                              for (attribute, _), value in zip(family.lifted.attributes, lifted.constants)])
        if not family.members:
            del self._families[lifted.family]
            family.query.close()

    def _fan_out_family(self, family: _Family, epoch: int, changes: list) -> None:
        for key, rows in family.routes.split(changes).items():
            for member, listener in list(family.members.get(key, {}).items()):
                first = member in family.fresh
                family.fresh.discard(member)
                self._push(listener, "diff", member[1], epoch, rows, first, False)

    def _forget_lifted_parameters(self) -> None:
        """Retract the facts of lifted parameters a durable server's state brought back (the
        interests they stood for went with the clients)."""
        stale = []
        for attribute in self.engine.schema:
            name = str(attribute.name)
            if name.startswith(LIFT_PREFIX):
                found = self.engine.query(f"[:find ?k ?v :where [?k {name} ?v]]", introspect=False)
                try:
                    stale += [[":db/retract", k, name, v] for (k, v) in found.rows()]
                finally:
                    found.close()
        if stale:
            self.engine.transact(stale)

    def explain(self, listener: Listener, name: str) -> str:
        """The plan of the query ``name`` as ``listener`` knows it (a lifted interest: what was
        lifted, and its family's plan)."""
        found = self._lifted.get((listener.client_id, name))
        if found is None:
            return self.query(name).explain()
        family, _, lifted = found
        return f"{lifted.explain()}\nshared with every interest of this shape: query {family.query.name}\n" \
               f"{family.query.explain()}"

    def publish(self, name: str, text: str, inputs: list, join: str, tenant: str | None) -> tuple[Query, bool]:
        """Install ``text`` as the published query ``name`` (tenant-routed by the variable
        ``tenant``, or public), durable on a durable server; returns it and whether it was
        new (publishing the same query under the same name again changes nothing)."""
        column = check_publication(text, tenant, self.engine.schema, self.engine.rules)
        plan = self.engine.plan(text, inputs=inputs, join=join)
        identity = plan.fingerprint()
        existing = self._queries.get(name)
        if existing is not None:
            if existing.identity == identity and existing.publication is not None \
                    and existing.publication.column == column:
                return existing.query, False
            raise ProtocolError("conflict", f"a different query is installed under the name {name!r}")
        label = json.dumps({"tenant": tenant, "column": column})
        query = self.engine.query(plan, name=name, durable=self.engine.durable, labels={LABEL: label})
        self._share(identity, query, Publication(column))
        return query, True

    def join(self, listener: Listener, name: str) -> tuple[Query, list[str]]:
        """Add ``listener`` to the published query ``name``: it receives its current rows (its
        own tenant's, for a routed query) at once, from the rows the server keeps, then
        every change that is its; returns the query and the columns it receives."""
        shared = self._queries.get(name)
        if shared is None or shared.publication is None:
            raise ProtocolError("not-found", f"no query named {name!r} is published")
        if listener.client_id in shared.listeners:
            raise ProtocolError("conflict", f"already interested in {name!r}")
        shared.listeners[listener.client_id] = listener
        listener.queries.add(name)
        publication, columns = shared.publication, shared.query.columns
        if listener.restricted:
            current = publication.current(listener.tenant.entity)
            columns = publication.columns(columns)
        else:
            current = publication.everything()
        self._push(listener, "diff", name, self.engine.epoch, current, True, False)
        return shared.query, columns

    def uninterest(self, listener: Listener, name: str) -> None:
        """Remove ``listener`` from the query ``name``; the last one out closes the query,
        unless it is durable or published (a lifted interest: its constants' parameter facts
        go with the last interest in them, the family's dataflow with its last member)."""
        if (listener.client_id, name) in self._lifted:
            self._leave_family(listener, name)
            return
        shared = self._queries.get(name)
        if shared is None or listener.client_id not in shared.listeners:
            raise ProtocolError("not-found", f"not interested in a query named {name!r}")
        del shared.listeners[listener.client_id]
        listener.queries.discard(name)
        if not shared.listeners and not shared.query.durable and shared.publication is None:
            del self._queries[name]
            shared.query.close()

    def drop(self, listener: Listener, name: str) -> None:
        """Close the query ``name`` for good (durable or not); refused while another client
        is interested in it."""
        shared = self._queries.get(name)
        if shared is None:
            raise ProtocolError("not-found", f"no query named {name!r} is installed")
        others = [c for c in shared.listeners if c != listener.client_id]
        if others:
            raise ProtocolError("conflict", f"{name!r} has {plural(len(others), 'other interested client')}")
        shared.listeners.clear()
        listener.queries.discard(name)
        del self._queries[name]
        shared.query.close()

    def subscribe(self, listener: Listener, attribute: str) -> None:
        """Send ``listener`` every later change of ``attribute``."""
        key = str(self.engine.schema.get(attribute).name)
        entry = self._attributes.get(key)
        if entry is None:
            listeners: dict[str, Listener] = {}
            unsubscribe = self.engine.subscribe_attribute(
                key, lambda epoch, changes, ls=listeners: self._fan_out_attribute(key, ls, epoch, changes))
            entry = self._attributes[key] = (listeners, unsubscribe)
        entry[0][listener.client_id] = listener
        listener.attributes.add(key)

    def unsubscribe(self, listener: Listener, attribute: str) -> None:
        """Stop sending ``listener`` the changes of ``attribute``."""
        key = str(self.engine.schema.get(attribute).name)
        if key not in listener.attributes:
            raise ProtocolError("not-found", f"not subscribed to {key}")
        self._drop_subscription(listener, key)

    def _drop_subscription(self, listener: Listener, key: str) -> None:
        listeners, unsubscribe = self._attributes[key]
        listeners.pop(listener.client_id, None)
        listener.attributes.discard(key)
        if not listeners:
            unsubscribe()
            del self._attributes[key]

    def release(self, listener: Listener) -> None:
        """Drop everything a departing client listened to."""
        for name in list(listener.queries):
            self.uninterest(listener, name)
        for key in list(listener.attributes):
            self._drop_subscription(listener, key)

    def release_all(self) -> None:
        """Close every shared query and subscription (the server has stopped)."""
        for shared in list(self._queries.values()):
            for listener in list(shared.listeners.values()):
                self.release(listener)
        for listeners, _ in list(self._attributes.values()):
            for listener in list(listeners.values()):
                self.release(listener)

    def query(self, name: str) -> Query:
        """The installed query ``name``."""
        shared = self._queries.get(name)
        if shared is None:
            raise ProtocolError("not-found", f"no query named {name!r} is installed")
        return shared.query

    def counts(self) -> dict[str, int]:
        """Interested clients per installed query (a family: its lifted interests)."""
        counts = {name: len(shared.listeners) for name, shared in self._queries.items()}
        counts.update({name: sum(map(len, f.members.values())) for name, f in self._families.items()})
        return counts

    def published(self) -> dict[str, dict[str, Any]]:
        """Per published query: whether tenant-routed, and the change rows dropped for tenants
        that had no connection."""
        return {name: {"tenant_routed": s.publication.tenant_routed, "dropped_rows": s.publication.dropped}
                for name, s in self._queries.items() if s.publication is not None}

    def _fan_out(self, shared: _Shared, epoch: int, changes: list) -> None:
        paced = shared.epoch == epoch  # a further chunk of the epoch (see the module docs)
        shared.epoch = epoch
        if shared.publication is None:
            for listener in list(shared.listeners.values()):
                self._push(listener, "diff", shared.query.name, epoch, changes, False, paced)
            return
        parts = shared.publication.split(changes)
        delivered = set()
        for listener in list(shared.listeners.values()):
            if not listener.restricted:
                self._push(listener, "diff", shared.query.name, epoch, changes, False, paced)
                continue
            key = listener.tenant.entity if shared.publication.tenant_routed else ""
            mine = parts.get(key)
            if mine:
                delivered.add(key)
                self._push(listener, "diff", shared.query.name, epoch, mine, False, paced)
        if shared.publication.tenant_routed:
            shared.publication.dropped += sum(len(rows) for key, rows in parts.items() if key not in delivered)

    # ------------------------------------------------------------ parameter attributes
    def follow_parameter(self, attribute: str) -> None:
        """Keep track of which tenant entities hold which facts of the parameter ``attribute``
        (its current facts read once, with a query; then its changes as they commit)."""
        if attribute in self._followed:
            return
        current = self.engine.query(f"[:find ?e ?v :where [?e {attribute} ?v]]", introspect=False)
        try:
            self._note(attribute, [((e, v), n) for (e, v), n in current.rows().items()])
        finally:
            current.close()
        self._followed[attribute] = self.engine.subscribe_attribute(
            attribute, lambda epoch, changes, a=attribute: self._note(a, changes))

    def _note(self, attribute: str, changes: list) -> None:
        for (entity, value), diff in changes:
            if is_tenant_entity(entity):
                held = self.parameters.setdefault(entity, Counter())
                held[(attribute, value)] += diff
                if not held[(attribute, value)]:
                    del held[(attribute, value)]
                if not held:
                    del self.parameters[entity]

    def parameter_retractions(self, entity: int) -> list[list]:
        """The operations retracting every parameter fact of the tenant ``entity``."""
        return [[":db/retract", entity, attribute, value]
                for (attribute, value), n in self.parameters.get(entity, Counter()).items() for _ in range(max(n, 0))]

    def _fan_out_attribute(self, key: str, listeners: dict[str, Listener], epoch: int, changes: list) -> None:
        for listener in list(listeners.values()):
            self._push(listener, "attribute", key, epoch, changes, False, False)

