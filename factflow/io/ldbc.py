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

__all__ = ["PERSON_ATTRIBUTES", "CSV_OPTIONS", "find_ldbc", "ldbc_file", "load_ldbc"]

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


def ldbc_file(root: str, name: str) -> str:
    """The path of the LDBC file ``name`` under ``root`` (or its dynamic/ or static/ folder)."""
    for sub in ("", "dynamic", "static"):
        path = os.path.join(root, sub, name)
        if os.path.exists(path):
            return path
    raise FactflowError(f"LDBC file {name} not found under {root}")


#: Spark CSV reader options of the LDBC files
CSV_OPTIONS = {"sep": "|", "header": "true"}


def load_ldbc(db, path: str | None = None, places: bool = True) -> dict[str, int]:
    """Create the schema and load persons, knows (and places) into ``db`` with
    :meth:`Engine.load`, one epoch per file; returns epochs by table."""
    root = find_ldbc(path)
    for attribute, (_, kind) in PERSON_ATTRIBUTES.items():
        db.create_attribute(attribute, type=kind, semantics="one")
    db.create_attribute(":person/knows", type="ref")

    def load(name: str, entity: str, attributes: dict[str, str]) -> int:
        return db.load(ldbc_file(root, name), entity=entity, attributes=attributes, options=CSV_OPTIONS).epoch

    epochs = {
        "persons": load("person_0_0.csv", "id", {a: column for a, (column, _) in PERSON_ATTRIBUTES.items()}),
        # Spark names the header's two Person.id columns Person.id0 and Person.id1
        "knows": load("person_knows_person_0_0.csv", "Person.id0", {":person/knows": "Person.id1"}),
    }
    if places:
        db.create_attribute(":person/place", type="ref", semantics="one")
        db.create_attribute(":place/name", type="string", semantics="one")
        db.create_attribute(":place/type", type="string", semantics="one")
        epochs["person places"] = load("person_isLocatedIn_place_0_0.csv", "Person.id", {":person/place": "Place.id"})
        epochs["places"] = load("place_0_0.csv", "id", {":place/name": "name", ":place/type": "type"})
    return epochs
