"""factflow.client: Python clients of a factflow server (protocol 1, over WebSocket); of
factflow it imports :mod:`factflow.errors` only, never the engine.

The blocking :class:`Client` mirrors :class:`factflow.Engine`::

    from factflow.client import Client

    with Client("ws://127.0.0.1:6262/", token=None) as db:
        db.create_attribute(":person/name", type="string", semantics="one")
        names = db.query("[:find ?p ?n :where [?p :person/name ?n]]")   # interest
        names.subscribe(lambda epoch, changes: print(epoch, changes))
        epoch = db.transact([[":db/add", 1, ":person/name", "Ann"]])    # or EDN text
        names.results()            # {(1, "Ann"): 1}, already including `epoch`
        db.q("[:find ?n :where [_ :person/name ?n]]")                  # one-shot: [("Ann",)]
        names.close()              # uninterest

:class:`AsyncClient` has the same methods as coroutines (``client = await
AsyncClient.connect(url)`` or ``async with AsyncClient(url) as client``); its query handles
also give ``async for epoch, changes in query.updates()``, as the blocking ones give
``for epoch, changes in query.updates()``.

Results. ``RemoteQuery.results()`` is ``{row_tuple: multiplicity}`` whatever the find
spec, summed from the diffs the server pushed (the first is the whole result when the
interest began), as of ``RemoteQuery.epoch``. Values are as JSON carries them: longs,
refs and doubles as numbers, strings, booleans, and instants as ISO-8601 strings (the
client does not know column types; convert with ``datetime.fromisoformat``). Sending,
a ``datetime`` becomes an ISO-8601 string, which the server reads for instant attributes.

Diffs. Each diff message is consolidated; a client that reads slowly gets the changes of
several epochs folded into one diff (at the latest of them), and an interest with
``granularity=G`` gets at most one diff per G seconds, folded the same way (so a
transaction's own changes to such a query may arrive after ``transact`` returns). Every
other query this client is interested in has its diffs of epoch N in hand when
``transact`` returns N (read-your-writes).

Sharing. A query without a name is named after its text, inputs and join, so clients
asking the same query share one dataflow on the server; give a name to find it in
``status()`` and ``explain(name)``. One client cannot be interested twice in one name.

Errors. A refused request raises :class:`~factflow.errors.ServerError` with the server's
message and ``category`` (``incorrect`` for a rejected transaction, query, rule or
attribute; ``not-found``, ``conflict``, ``forbidden``, ``unsupported``, ``fault``). A
connection that cannot be opened or that closes raises
:class:`~factflow.errors.ConnectionClosedError` (with the server's close code and reason)
from every waiting and later request, and ends every query handle; with ``timeout`` set,
a reply that does not come in time raises :class:`~factflow.errors.RequestTimeoutError`.

Threads and order: see :mod:`factflow.client.sync` and :mod:`factflow.client.aio`; the
wire format and the assembly of results are in :mod:`factflow.client.messages`.
"""

from factflow.client.aio import AsyncClient, AsyncRemoteQuery, AsyncUpdates
from factflow.client.sync import Client, RemoteQuery, Updates

__all__ = ["Client", "RemoteQuery", "Updates", "AsyncClient", "AsyncRemoteQuery", "AsyncUpdates"]
