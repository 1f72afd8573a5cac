"""The wire protocol (version 1): requests checked, replies and pushed messages built.

Everything a client sends is checked here before it reaches the engine: a frame must be
UTF-8 JSON holding one request object or an array of them; a request names a known
``op``, carries the fields that op needs with the right JSON types, and nothing reaches
the engine otherwise. A failed check is a :class:`ProtocolError` with its category, which
becomes the request's error reply. docs/protocol.md documents every op with examples.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from factflow.errors import FactflowError
from factflow.text import plural

__all__ = ["PROTOCOL_VERSION", "CATEGORIES", "OPS", "ProtocolError", "Request", "parse_frame", "reply_ok",
           "reply_error", "diff_message", "attribute_message", "encode"]

PROTOCOL_VERSION = 1
CATEGORIES = ("incorrect", "not-found", "conflict", "forbidden", "unsupported", "fault")

_ANY = object()
_NUMBER = (int, float)
#: Per op: its fields, each ``(name, JSON types, required)``.
OPS: dict[str, tuple[tuple[str, Any, bool], ...]] = {
    "hello": (("protocol", int, True), ("token", str, False), ("keep", bool, False)),
    "create-attribute": (("name", str, True), ("type", str, False), ("semantics", str, False),
                         ("index", str, False), ("support", str, False), ("slack", int, False),
                         ("parameter", bool, False)),
    "transact": (("tx", (list, str), True),),
    "register": (("rules", str, True),),
    "interest": (("name", str, False), ("query", str, False), ("inputs", list, False), ("join", str, False),
                 ("granularity", _NUMBER, False), ("durable", bool, False)),
    "publish": (("name", str, True), ("query", str, True), ("inputs", list, False), ("join", str, False),
                ("tenant", str, False)),
    "uninterest": (("name", str, True),),
    "drop": (("name", str, True),),
    "subscribe": (("attribute", str, True),),
    "unsubscribe": (("attribute", str, True),),
    "query": (("query", str, True), ("inputs", list, False)),
    "explain": (("name", str, True),),
    "status": (),
    "shutdown": (),
    # read-only views (the console's; see factflow.server.views)
    "epochs": (("since", int, False), ("limit", int, False)),
    "queries": (),
    "plan": (("name", str, True),),
    "state": (),
    "clients": (),
}


class ProtocolError(FactflowError):
    """A request the server refuses, with the category its error reply carries."""

    def __init__(self, category: str, message: str):
        super().__init__(message)
        self.category = category


@dataclass(frozen=True)
class Request:
    """One checked request: its op, its id (any JSON value, echoed in the reply) and its fields."""

    op: str
    id: Any
    fields: dict[str, Any]


def parse_frame(text: str) -> list[Request | ProtocolError]:
    """The requests of one text frame, in order; a request that fails its checks is returned
    as its error (with the id it carried, if any, in ``error.request_id``).

    Raises :class:`ProtocolError` when the frame as a whole is not JSON or not a request
    object or array of them.
    """
    try:
        payload = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError("incorrect", f"the frame is not valid JSON: {exc}") from None
    items = payload if isinstance(payload, list) else [payload]
    if not items:
        raise ProtocolError("incorrect", "the frame is an empty array: no requests")
    return [_request(item) for item in items]


def _request(item: Any) -> Request | ProtocolError:
    if not isinstance(item, dict):
        error = ProtocolError("incorrect", f"a request must be a JSON object, got {_json_type(item)}")
        error.request_id = None
        return error
    request_id = item.get("id")
    op = item.get("op")
    error: ProtocolError | None = None
    if op is None:
        error = ProtocolError("incorrect", "the request has no \"op\"")
    elif not isinstance(op, str):
        error = ProtocolError("incorrect", f"\"op\" must be a string, got {_json_type(op)}")
    elif op not in OPS:
        error = ProtocolError("unsupported", f"unknown op {op!r}; known ops: {', '.join(OPS)}")
    else:
        error = _check_fields(op, item)
    if error is not None:
        error.request_id = request_id
        return error
    return Request(op, request_id, {k: v for k, v in item.items() if k not in ("op", "id")})


def _check_fields(op: str, item: dict) -> ProtocolError | None:
    known = {"op", "id"}
    for name, types, required in OPS[op]:
        known.add(name)
        if name not in item:
            if required:
                return ProtocolError("incorrect", f"{op}: missing field \"{name}\"")
            continue
        value = item[name]
        if isinstance(value, bool) and types is not bool or not isinstance(value, types):
            expected = " or ".join(_json_type_name(t) for t in (types if isinstance(types, tuple) else (types,)))
            return ProtocolError("incorrect", f"{op}: field \"{name}\" must be {expected}, got {_json_type(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            return ProtocolError("incorrect", f"{op}: field \"{name}\" must be a finite number")
    unknown = sorted(set(item) - known)
    if unknown:
        return ProtocolError("incorrect", f"{op}: {plural(len(unknown), 'unknown field')}: {', '.join(unknown)}")
    return None


def _json_type_name(t: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", list: "an array", dict: "an object",
            bool: "a boolean"}.get(t, t.__name__)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return _json_type_name(type(value))


# ------------------------------------------------------------------ outgoing messages

def reply_ok(request_id: Any, result: Any) -> dict:
    """The reply to a request that succeeded."""
    return {"id": request_id, "ok": True, "result": result}


def reply_error(request_id: Any, category: str, message: str) -> dict:
    """The reply to a request that failed."""
    return {"id": request_id, "ok": False, "error": {"category": category, "message": message}}


def diff_message(query: str, epoch: int, changes: list[tuple[tuple, int]]) -> dict:
    """A pushed diff of one query at one epoch."""
    return {"type": "diff", "query": query, "epoch": epoch, "changes": [[list(row), diff] for row, diff in changes]}


def attribute_message(attribute: str, epoch: int, changes: list[tuple[tuple, int]]) -> dict:
    """A pushed change of one attribute at one epoch."""
    return {"type": "attribute", "attribute": attribute, "epoch": epoch,
            "changes": [[list(fact), diff] for fact, diff in changes]}


def _json_value(value: Any) -> Any:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.isoformat()
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Mapping):  # a pulled entity (factflow.PullMap)
        return dict(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def encode(message: dict) -> str:
    """A message as JSON text (instants as ISO-8601 strings)."""
    return json.dumps(message, default=_json_value, allow_nan=False, separators=(",", ":"))
