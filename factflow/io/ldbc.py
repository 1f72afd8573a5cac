"""Loading the LDBC Social Network Benchmark (interactive, CSV layout) as facts.

Persons become entities with attributes ``:person/firstName``, ``:person/lastName``,
``:person/gender``, ``:person/birthday`` (instant), ``:person/creationDate`` (instant),
``:person/locationIP``, ``:person/browserUsed`` (all cardinality one), plus the
relations ``:person/knows`` (ref) and ``:person/place`` (ref, one) and places'
``:place/name`` and ``:place/type``. Each file is one :meth:`Engine.load` (Spark's CSV
reader; instants are the files' milliseconds since the epoch).
"""

from __future__ import annotations

import os
from importlib import resources

from factflow.errors import FactflowError

__all__ = ["PERSON_ATTRIBUTES", "find_ldbc", "load_ldbc"]

#: attribute -> (column in person_0_0.csv, value type)
PERSON_ATTRIBUTES = {
    ":person/firstName": ("firstName", "string"),
    ":person/lastName": ("lastName", "string"),
    ":person/gender": ("gender", "string"),
    ":person/birthday": ("birthday", "instant"),
    ":person/creationDate": ("creationDate", "instant"),
    ":person/locationIP": ("locationIP", "string"),
    ":person/browserUsed": ("browserUsed", "string"),
}


def find_ldbc(path: str | None = None) -> str:
    """The directory of the LDBC data: ``path``, ``$FACTFLOW_LDBC``, ``../shared/data/ldbc-snb-tiny``
    next to the working directory or the repository, or the subset shipped with factflow."""
    candidates = [path, os.environ.get("FACTFLOW_LDBC")]
    here = os.path.dirname(os.path.abspath(__file__))
    for base in (os.getcwd(), os.path.join(here, "..", "..")):
        candidates.append(os.path.join(base, "..", "shared", "data", "ldbc-snb-tiny"))
        candidates.append(os.path.join(base, "shared", "data", "ldbc-snb-tiny"))
    for candidate in candidates:
        if candidate and os.path.isdir(candidate):
            return os.path.abspath(candidate)
    return str(resources.files("factflow") / "data" / "ldbc-snb-tiny")


def _file(root: str, name: str) -> str:
    for sub in ("", "dynamic", "static"):
        path = os.path.join(root, sub, name)
        if os.path.exists(path):
            return path
    raise FactflowError(f"LDBC file {name} not found under {root}")


_CSV = {"sep": "|", "header": "true"}


def load_ldbc(db, path: str | None = None, places: bool = True) -> dict[str, int]:
    """Create the schema and load persons, knows (and places) into ``db`` with
    :meth:`Engine.load`, one epoch per file; returns epochs by table."""
    root = find_ldbc(path)
    for attribute, (_, kind) in PERSON_ATTRIBUTES.items():
        db.create_attribute(attribute, type=kind, semantics="one")
    db.create_attribute(":person/knows", type="ref")
    persons = {attribute: column for attribute, (column, _) in PERSON_ATTRIBUTES.items()}
    epochs = {
        "persons": db.load(_file(root, "person_0_0.csv"), entity="id", attributes=persons, options=_CSV).epoch,
        # Spark names the header's two Person.id columns Person.id0 and Person.id1
        "knows": db.load(_file(root, "person_knows_person_0_0.csv"), entity="Person.id0",
                         attributes={":person/knows": "Person.id1"}, options=_CSV).epoch,
    }
    if places:
        db.create_attribute(":person/place", type="ref", semantics="one")
        db.create_attribute(":place/name", type="string", semantics="one")
        db.create_attribute(":place/type", type="string", semantics="one")
        epochs["person places"] = db.load(_file(root, "person_isLocatedIn_place_0_0.csv"), entity="Person.id",
                                          attributes={":person/place": "Place.id"}, options=_CSV).epoch
        epochs["places"] = db.load(_file(root, "place_0_0.csv"), entity="id",
                                   attributes={":place/name": "name", ":place/type": "type"}, options=_CSV).epoch
    return epochs
