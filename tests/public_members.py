"""Every public method and property of a class, called on a closed object (tests of the closed errors)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from factflow import EngineClosedError


def not_refused(obj: Any, message: str, exempt: tuple[str, ...] = ("close",)) -> dict[str, str]:
    """The public methods and properties of ``obj``'s class (all but ``exempt``) that do not
    raise ``EngineClosedError(message)`` on the closed ``obj``, each called with None for
    every required argument (the closed check must come before any other), mapped to what
    they did instead. A method or property added later is covered without naming it here."""
    found = {}
    for name in dir(type(obj)):
        member = inspect.getattr_static(obj, name)
        if name.startswith("_") or name in exempt or not (callable(member) or isinstance(member, property)):
            continue
        try:
            if isinstance(member, property):
                getattr(obj, name)
            else:
                method = getattr(obj, name)
                required = [p for p in inspect.signature(method).parameters.values()
                            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
                result = method(*[None] * len(required))
                if inspect.iscoroutine(result):
                    asyncio.run(result)
            found[name] = "returned"
        except EngineClosedError as exc:
            if str(exc) != message:
                found[name] = f"said {str(exc)!r}"
        except Exception as exc:  # noqa: BLE001 - reported, not raised: the test lists every member at once
            found[name] = f"raised {type(exc).__name__}: {exc}"
    return found
