"""A reader for EDN (extensible data notation), the syntax of queries, rules and transactions.

``read(text)`` returns Python values: lists ``(...)`` become :class:`EdnList`, vectors
``[...]`` become :class:`EdnVector` (both tuples, so the query parser can tell them apart),
maps become ``dict``, sets ``frozenset``, symbols :class:`Symbol`, keywords :class:`Keyword`,
``nil`` ``None``, ``#inst "..."`` a timezone-aware ``datetime`` and ``#uuid "..."`` a
``uuid.UUID``. Collections and symbols remember the line and column where they started,
so later errors can point at them. :func:`write` renders values back to EDN text.
"""

from __future__ import annotations

import datetime as _dt
import re
import uuid
from typing import Any

from factflow.errors import EdnSyntaxError

__all__ = ["Symbol", "Keyword", "EdnList", "EdnVector", "read", "read_all", "write"]


class Symbol(str):
    """An EDN symbol such as ``?x``, ``_``, ``>=`` or ``$``."""

    __slots__ = ("line", "column")

    def __new__(cls, name: str, line: int | None = None, column: int | None = None):
        obj = super().__new__(cls, name)
        obj.line = line
        obj.column = column
        return obj

    def __repr__(self) -> str:
        return f"Symbol({str.__str__(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Symbol) and str.__eq__(self, other)

    def __hash__(self) -> int:
        return hash(("sym", str.__str__(self)))


class Keyword(str):
    """An EDN keyword; the value is its text with the leading colon, e.g. ``:person/name``."""

    __slots__ = ("line", "column")

    def __new__(cls, name: str, line: int | None = None, column: int | None = None):
        if not name.startswith(":"):
            name = ":" + name
        obj = super().__new__(cls, name)
        obj.line = line
        obj.column = column
        return obj

    def __repr__(self) -> str:
        return f"Keyword({str.__str__(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keyword) and str.__eq__(self, other)

    def __hash__(self) -> int:
        return hash(("kw", str.__str__(self)))


class _Positioned(tuple):
    """A tuple that remembers where its opening bracket was."""

    line: int | None = None
    column: int | None = None

    def __new__(cls, items=(), line: int | None = None, column: int | None = None):
        obj = super().__new__(cls, items)
        obj.line = line
        obj.column = column
        return obj

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple.__hash__(self)))


class EdnList(_Positioned):
    """An EDN list ``( ... )``."""

    def __repr__(self) -> str:
        return f"EdnList({list(self)!r})"


class EdnVector(_Positioned):
    """An EDN vector ``[ ... ]``."""

    def __repr__(self) -> str:
        return f"EdnVector({list(self)!r})"


_DELIMS = set("()[]{}\"; \t\r\n,")
_INT_RE = re.compile(r"[+-]?(0|[1-9][0-9]*)N?$")
_FLOAT_RE = re.compile(r"[+-]?(0|[1-9][0-9]*)(\.[0-9]*)?([eE][+-]?[0-9]+)?M?$")
_SYMBOL_START = re.compile(r"[A-Za-z.*+!\-_?$%&=<>/]")
_SYMBOL_BODY = re.compile(r"[A-Za-z0-9.*+!\-_?$%&=<>/:#']*$")
_CHAR_NAMES = {"newline": "\n", "space": " ", "tab": "\t", "return": "\r", "formfeed": "\f", "backspace": "\b"}
_STRING_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "b": "\b", "f": "\f", "/": "/"}
_CLOSERS = {"(": ")", "[": "]", "{": "}"}


class _Reader:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.n = len(text)

    def where(self, pos: int | None = None) -> tuple[int, int]:
        pos = self.pos if pos is None else pos
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return line, col

    def error(self, message: str, pos: int | None = None) -> EdnSyntaxError:
        line, col = self.where(pos)
        return EdnSyntaxError(message, line, col)

    def skip_ws(self) -> None:
        text, n = self.text, self.n
        while self.pos < n:
            ch = text[self.pos]
            if ch in " \t\r\n,":
                self.pos += 1
            elif ch == ";":
                nl = text.find("\n", self.pos)
                self.pos = n if nl < 0 else nl + 1
            elif text.startswith("#_", self.pos):
                self.pos += 2
                self.skip_ws()
                if self.pos >= n:
                    raise self.error("#_ must be followed by a form to discard")
                self.read_form()
            else:
                return

    def read_form(self) -> Any:
        self.skip_ws()
        if self.pos >= self.n:
            raise self.error("unexpected end of input")
        start = self.pos
        ch = self.text[start]
        if ch in "([{":
            self.pos += 1
            items = self.read_seq(_CLOSERS[ch], start)
            line, col = self.where(start)
            if ch == "(":
                return EdnList(items, line, col)
            if ch == "[":
                return EdnVector(items, line, col)
            if len(items) % 2:
                raise self.error("a map needs an even number of forms", start)
            result: dict = {}
            for k, v in zip(items[::2], items[1::2]):
                if k in result:
                    raise self.error(f"duplicate map key {write(k)}", start)
                result[k] = v
            return result
        if ch in ")]}":
            raise self.error(f"unmatched '{ch}'")
        if ch == '"':
            return self.read_string()
        if ch == "\\":
            return self.read_char()
        if ch == "#":
            return self.read_dispatch()
        return self.read_atom()

    def read_seq(self, closer: str, start: int) -> list:
        items = []
        while True:
            self.skip_ws()
            if self.pos >= self.n:
                opener = self.text[start]
                raise self.error(f"'{opener}' is never closed", start)
            ch = self.text[self.pos]
            if ch == closer:
                self.pos += 1
                return items
            if ch in ")]}":
                raise self.error(f"expected '{closer}' but found '{ch}'")
            items.append(self.read_form())

    def read_string(self) -> str:
        start = self.pos
        self.pos += 1
        out = []
        text, n = self.text, self.n
        while self.pos < n:
            ch = text[self.pos]
            if ch == '"':
                self.pos += 1
                return "".join(out)
            if ch == "\\":
                if self.pos + 1 >= n:
                    break
                esc = text[self.pos + 1]
                if esc in _STRING_ESCAPES:
                    out.append(_STRING_ESCAPES[esc])
                    self.pos += 2
                elif esc == "u":
                    hexdigits = text[self.pos + 2 : self.pos + 6]
                    if not re.fullmatch(r"[0-9a-fA-F]{4}", hexdigits):
                        raise self.error("bad \\u escape in string")
                    out.append(chr(int(hexdigits, 16)))
                    self.pos += 6
                else:
                    raise self.error(f"unknown escape \\{esc} in string")
            else:
                out.append(ch)
                self.pos += 1
        raise self.error("string is never closed", start)

    def read_token(self) -> str:
        start = self.pos
        while self.pos < self.n and self.text[self.pos] not in _DELIMS:
            self.pos += 1
        return self.text[start : self.pos]

    def read_char(self) -> str:
        start = self.pos
        self.pos += 1
        if self.pos >= self.n:
            raise self.error("\\ at end of input", start)
        # a single delimiter character such as \( or \space-less \, is itself the char
        token = self.read_token()
        if not token:
            ch = self.text[self.pos]
            self.pos += 1
            return ch
        if len(token) == 1:
            return token
        if token in _CHAR_NAMES:
            return _CHAR_NAMES[token]
        if re.fullmatch(r"u[0-9a-fA-F]{4}", token):
            return chr(int(token[1:], 16))
        raise self.error(f"unknown character literal \\{token}", start)

    def read_dispatch(self) -> Any:
        start = self.pos
        nxt = self.text[start + 1 : start + 2]
        if nxt == "{":
            self.pos += 2
            items = self.read_seq("}", start)
            try:
                result = frozenset(items)
            except TypeError as exc:
                raise self.error(f"set element is not hashable: {exc}", start) from None
            if len(result) != len(items):
                raise self.error("duplicate element in set", start)
            return result
        self.pos += 1
        tag = self.read_token()
        if not tag or not _SYMBOL_START.match(tag):
            raise self.error("'#' must start a set, a discard #_ or a tagged literal", start)
        value = self.read_form()
        if tag == "inst":
            if not isinstance(value, str):
                raise self.error("#inst needs a string", start)
            return parse_instant(value, lambda msg: self.error(msg, start))
        if tag == "uuid":
            if not isinstance(value, str):
                raise self.error("#uuid needs a string", start)
            try:
                return uuid.UUID(value)
            except ValueError:
                raise self.error(f"bad #uuid {value!r}", start) from None
        raise self.error(f"unknown tag #{tag}", start)

    def read_atom(self) -> Any:
        start = self.pos
        token = self.read_token()
        if not token:
            raise self.error(f"unexpected character {self.text[start]!r}")
        line, col = self.where(start)
        first = token[0]
        if first.isdigit() or (first in "+-" and len(token) > 1 and token[1].isdigit()):
            if _INT_RE.match(token):
                return int(token.rstrip("N"))
            if _FLOAT_RE.match(token):
                return float(token.rstrip("M"))
            raise self.error(f"bad number {token!r}", start)
        if first == ":":
            body = token[1:]
            if not body or body.startswith(":") or not _SYMBOL_BODY.match(body) or body.endswith("/"):
                raise self.error(f"bad keyword {token!r}", start)
            return Keyword(token, line, col)
        if token == "nil":
            return None
        if token == "true":
            return True
        if token == "false":
            return False
        if not _SYMBOL_START.match(first) or not _SYMBOL_BODY.match(token[1:]):
            raise self.error(f"bad symbol {token!r}", start)
        return Symbol(token, line, col)


def parse_instant(text: str, error=None) -> _dt.datetime:
    """Parse an RFC 3339 timestamp (as in ``#inst``) into a timezone-aware UTC datetime."""
    candidate = text.strip()
    if candidate.endswith("Z") or candidate.endswith("z"):
        candidate = candidate[:-1] + "+00:00"
    try:
        value = _dt.datetime.fromisoformat(candidate)
    except ValueError:
        if error is None:
            raise ValueError(f"bad instant {text!r}") from None
        raise error(f"bad #inst {text!r}") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return value.astimezone(_dt.timezone.utc)


def read(text: str) -> Any:
    """Read exactly one EDN form from ``text``."""
    if not isinstance(text, str):
        raise EdnSyntaxError(f"EDN input must be a string, not {type(text).__name__}")
    reader = _Reader(text)
    form = reader.read_form()
    reader.skip_ws()
    if reader.pos < reader.n:
        raise reader.error("unexpected text after the form")
    return form


def read_all(text: str) -> list:
    """Read every EDN form in ``text``."""
    reader = _Reader(text)
    forms = []
    reader.skip_ws()
    while reader.pos < reader.n:
        forms.append(reader.read_form())
        reader.skip_ws()
    return forms


def write(value: Any) -> str:
    """Render a value as EDN text (used in error messages and explain output)."""
    if value is None:
        return "nil"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (Symbol, Keyword)):
        return str.__str__(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        return f'"{escaped}"'
    if isinstance(value, EdnList):
        return "(" + " ".join(write(v) for v in value) + ")"
    if isinstance(value, (EdnVector, list, tuple)):
        return "[" + " ".join(write(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{write(k)} {write(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (set, frozenset)):
        return "#{" + " ".join(write(v) for v in value) + "}"
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        stamp = value.astimezone(_dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return f'#inst "{stamp}"'
    if isinstance(value, uuid.UUID):
        return f'#uuid "{value}"'
    if isinstance(value, float):
        return repr(value)
    return str(value)
