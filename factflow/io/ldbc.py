"""Loading the LDBC Social Network Benchmark (interactive, CSV layout) as facts.

Persons become entities with attributes ``:person/firstName``, ``:person/lastName``,
``:person/gender``, ``:person/birthday`` (instant), ``:person/creationDate`` (instant),
``:person/locationIP``, ``:person/browserUsed`` (all cardinality one), plus the
relations ``:person/knows`` (ref) and ``:person/place`` (ref, one) and places'
``:place/name`` and ``:place/type``. Files are read with Spark's CSV reader.
"""

from __future__ import annotations

import os
from importlib import resources

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from factflow.errors import FactflowError

__all__ = ["PERSON_ATTRIBUTES", "find_ldbc", "person_facts", "knows_facts", "load_ldbc"]

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


def _read(spark, root: str, name: str) -> DataFrame:
    return spark.read.csv(_file(root, name), sep="|", header=True)


def person_facts(spark, root: str, value_type: str) -> DataFrame:
    """Person attribute facts ``(e, a, v)`` of one value type (one DataFrame per type)."""
    persons = _read(spark, root, "person_0_0.csv")
    parts = []
    for attribute, (column, kind) in PERSON_ATTRIBUTES.items():
        if kind != value_type:
            continue
        value = F.col(column)
        if kind == "instant":
            value = F.timestamp_millis(value.cast("long")).cast("timestamp_ntz")
        parts.append(persons.select(F.col("id").cast("long").alias("e"), F.lit(attribute).alias("a"),
                                    value.alias("v")))
    frame = parts[0]
    for p in parts[1:]:
        frame = frame.unionByName(p)
    return frame


def knows_facts(spark, root: str) -> DataFrame:
    """``:person/knows`` facts from person_knows_person (as stored: one direction per pair)."""
    knows = _read(spark, root, "person_knows_person_0_0.csv")
    source, target = knows.columns[0], knows.columns[1]
    return knows.select(F.col(f"`{source}`").cast("long").alias("e"), F.lit(":person/knows").alias("a"),
                        F.col(f"`{target}`").cast("long").alias("v"))


def place_facts(spark, root: str) -> tuple[DataFrame, DataFrame]:
    """``:person/place`` (ref) facts and ``:place/name`` / ``:place/type`` (string) facts."""
    located = _read(spark, root, "person_isLocatedIn_place_0_0.csv")
    person, place = located.columns[0], located.columns[1]
    refs = located.select(F.col(f"`{person}`").cast("long").alias("e"), F.lit(":person/place").alias("a"),
                          F.col(f"`{place}`").cast("long").alias("v"))
    places = _read(spark, root, "place_0_0.csv")
    names = places.select(F.col("id").cast("long").alias("e"), F.lit(":place/name").alias("a"), F.col("name").alias("v"))
    types = places.select(F.col("id").cast("long").alias("e"), F.lit(":place/type").alias("a"), F.col("type").alias("v"))
    return refs, names.unionByName(types)


def load_ldbc(db, path: str | None = None, places: bool = True) -> dict[str, int]:
    """Create the schema and load persons, knows (and places) into ``db``; returns epochs by table."""
    root = find_ldbc(path)
    for attribute, (_, kind) in PERSON_ATTRIBUTES.items():
        db.create_attribute(attribute, type=kind, semantics="one")
    db.create_attribute(":person/knows", type="ref")
    epochs = {
        "person strings": db.transact(person_facts(db.spark, root, "string")),
        "person instants": db.transact(person_facts(db.spark, root, "instant")),
        "knows": db.transact(knows_facts(db.spark, root)),
    }
    if places:
        db.create_attribute(":person/place", type="ref", semantics="one")
        db.create_attribute(":place/name", type="string", semantics="one")
        db.create_attribute(":place/type", type="string", semantics="one")
        refs, names = place_facts(db.spark, root)
        epochs["person places"] = db.transact(refs)
        epochs["place names"] = db.transact(names)
    return epochs
