"""Tenants of a server: who a connection is, what it may do, and the entity that stands for it.

``factflow serve --tenants FILE`` reads a JSON file::

    {"tenants": [{"name": "acme", "token_sha256": "<hex>", "role": "tenant"},
                 {"name": "ops",  "token_sha256": "<hex>", "role": "admin"}]}

``token_sha256`` is the lowercase hex SHA-256 of the token's UTF-8 bytes, so the file holds
no secret. A connection presents its token as without tenants (``hello`` or an
``Authorization: Bearer`` header); the server hashes it and finds the tenant, never taking
a name the client claims.

* An **admin** may do everything a client of a server without tenants may, and
  ``publish`` queries for tenants.
* A **tenant** may only say ``hello``, ask ``status`` (its own interests), join and leave
  queries an admin published (``interest``/``uninterest`` by name: it sends no query text,
  so it reads only what was published for it), and ``transact`` facts whose entity is its
  own on *parameter attributes* (created by an admin with ``"parameter": true``). Anything
  else, a transaction mixing allowed and forbidden operations included, is ``forbidden``
  and changes nothing.

Each tenant is an entity: an id derived from its name (:func:`tenant_entity`), so it is the
same after a restart, in a range no other entity of factflow's uses (``[-2**61, -2**60)``;
the engine's introspection entities lie below ``-2**61``). Facts an admin writes about it
(``[acme :tenant/may-read doc]``) are entitlements a published query can join, so that a
tenant's own parameters only narrow what it is entitled to see.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from factflow import edn
from factflow.errors import EdnSyntaxError, FactflowError, SchemaError
from factflow.model.schema import Schema
from factflow.server.protocol import ProtocolError

__all__ = ["Tenant", "Tenants", "TenantsFileError", "ROLES", "TENANT_OPS", "tenant_entity", "is_tenant_entity",
           "check_tenant_transaction"]

ROLES = ("tenant", "admin")
#: The ops a tenant may send (every other op is forbidden to it).
TENANT_OPS = frozenset({"hello", "status", "queries", "interest", "uninterest", "transact"})
_LOW, _HIGH = -(2**61), -(2**60)
_DIGEST = re.compile(r"[0-9a-f]{64}")


class TenantsFileError(FactflowError):
    """The tenants file cannot be used; the message names the file and the offending entry."""


@dataclass(frozen=True)
class Tenant:
    """One tenant of the server: its ``name``, ``role`` and, for a tenant, its ``entity``."""

    name: str
    role: str

    @property
    def admin(self) -> bool:
        """Whether it may do everything (and publish)."""
        return self.role == "admin"

    @property
    def entity(self) -> int | None:
        """The entity standing for a tenant in facts (None for an admin)."""
        return None if self.admin else tenant_entity(self.name)


def tenant_entity(name: str) -> int:
    """The entity of the tenant called ``name``: derived from the name, in ``[-2**61, -2**60)``."""
    offset = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % (_HIGH - _LOW)
    return _LOW + offset


def is_tenant_entity(entity: Any) -> bool:
    """Whether ``entity`` lies in the range of tenant entities."""
    return isinstance(entity, int) and not isinstance(entity, bool) and _LOW <= entity < _HIGH


class Tenants:
    """The tenants of a server, found by the digest of the token a connection presents."""

    def __init__(self, tenants: list[tuple[Tenant, str]]):
        self.by_digest = {digest: tenant for tenant, digest in tenants}
        self.by_name = {tenant.name: tenant for tenant, _ in tenants}

    @classmethod
    def load(cls, path: str) -> "Tenants":
        """Read and check the tenants file ``path`` (see the module docstring)."""
        try:
            with open(path, encoding="utf-8") as handle:
                document = json.load(handle)
        except OSError as exc:
            raise TenantsFileError(f"cannot read the tenants file {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise TenantsFileError(f"the tenants file {path} is not JSON: {exc}") from None
        entries = document.get("tenants") if isinstance(document, dict) else None
        if not isinstance(entries, list) or not entries:
            raise TenantsFileError(f"the tenants file {path} must be an object with a non-empty list \"tenants\"")
        tenants, names, digests, entities = [], set(), set(), {}
        for position, entry in enumerate(entries):
            where = f"{path}, tenant {position}"
            if not isinstance(entry, dict) or set(entry) != {"name", "token_sha256", "role"}:
                raise TenantsFileError(f"{where}: an entry has exactly the fields name, token_sha256 and role")
            name, digest, role = entry["name"], entry["token_sha256"], entry["role"]
            if not isinstance(name, str) or not name:
                raise TenantsFileError(f"{where}: name must be a non-empty string")
            if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
                raise TenantsFileError(f"{where} ({name}): token_sha256 must be 64 lowercase hex digits (the SHA-256 "
                                       "of the token's UTF-8 bytes)")
            if role not in ROLES:
                raise TenantsFileError(f"{where} ({name}): role must be one of {', '.join(ROLES)}, not {role!r}")
            if name in names:
                raise TenantsFileError(f"{where}: the name {name!r} is taken by an earlier entry")
            if digest in digests:
                raise TenantsFileError(f"{where} ({name}): an earlier entry has the same token")
            tenant = Tenant(name, role)
            if tenant.entity is not None and tenant.entity in entities:  # a 60-bit collision: astronomically rare
                raise TenantsFileError(f"{where} ({name}): its entity collides with {entities[tenant.entity]!r}'s")
            names.add(name)
            digests.add(digest)
            if tenant.entity is not None:
                entities[tenant.entity] = name
            tenants.append((tenant, digest))
        return cls(tenants)

    def authenticate(self, token: Any) -> Tenant | None:
        """The tenant whose token this is, or None."""
        if not isinstance(token, str):
            return None
        return self.by_digest.get(hashlib.sha256(token.encode()).hexdigest())


def check_tenant_transaction(tenant: Tenant, tx: Any, schema: Schema) -> None:
    """Refuse (``forbidden``) a tenant's transaction unless every operation asserts or
    retracts a fact of the tenant's own entity on a parameter attribute."""
    if isinstance(tx, str):
        try:
            tx = edn.read(tx)
        except EdnSyntaxError as exc:
            raise ProtocolError("incorrect", f"transaction rejected: {exc}") from None
    if not isinstance(tx, (list, tuple)):
        raise ProtocolError("incorrect", "a tenant's transaction is a list of [op entity attribute value]")
    refused = []
    for position, op in enumerate(tx):
        if not isinstance(op, (list, tuple)) or len(op) != 4:
            refused.append(f"operation {position} is not [op entity attribute value]")
            continue
        entity, attribute = op[1], op[2]
        if entity != tenant.entity or isinstance(entity, bool):
            refused.append(f"operation {position} is about entity {entity!r}, not the tenant's own ({tenant.entity})")
            continue
        try:
            parameter = schema.get(str(attribute)).parameter
        except SchemaError:
            parameter = False
        if not parameter:
            refused.append(f"operation {position} writes {attribute}, which is not a parameter attribute")
    if refused:
        raise ProtocolError("forbidden", f"tenant {tenant.name} may write only parameter attributes of its own entity: "
                                         f"{'; '.join(refused[:5])}"
                                         + (f" (and {len(refused) - 5} more)" if len(refused) > 5 else ""))
