"""The exception hierarchy says what was rejected (checked without Spark where the driver rejects)."""

import pandas as pd
import pytest

from factflow import EdnSyntaxError, QueryError, RuleError, TransactionError, UnknownAttributeError
from factflow.engine.transaction import prepare, read_wide
from factflow.lang.parser import parse_query, parse_rules
from factflow.lang.rules import RuleStore
from factflow.model.schema import Schema


def _schema() -> Schema:
    schema = Schema()
    schema.create(":person/age", "long", "one")
    return schema


@pytest.mark.parametrize("tx, cause, fragments", [
    ([[":db/add", 1, ":person/age", 3], [":db/add", 2, ":person/nope", 4]], UnknownAttributeError,
     ["operation 1", ":person/nope"]),
    ('[[:db/add 1 :person/age 3]\n [:db/add 2 :person/age', EdnSyntaxError, ["malformed transaction EDN", "line 2"]),
    (pd.DataFrame({"e": [1, 2], "a": [":person/age", ":nope/x"], "v": [3, 4]}), UnknownAttributeError,
     ["transaction DataFrame, row 1 (entity 2)", ":nope/x"]),
    (pd.DataFrame({"e": [1], "a": ["no-colon"], "v": [3]}), UnknownAttributeError, ["no-colon"]),
], ids=["ops", "edn", "pandas", "pandas-bad-name"])
def test_rejected_transactions_raise_transaction_errors_chained_from_the_cause(tx, cause, fragments):
    with pytest.raises(TransactionError) as info:
        prepare(tx, _schema(), spark=None, local_limit=100)  # rejected before Spark is needed
    assert isinstance(info.value.__cause__, cause), repr(info.value.__cause__)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


@pytest.mark.parametrize("frame, fragment", [
    (pd.DataFrame({"e": [1, 2], "a": [":person/age"] * 2, "v": [3, 4], "adde": [True, False]}),
     "1 unknown column: 'adde'"),
    (pd.DataFrame({"e": [1], "a": [":person/age"], "value": [3], "t": [0]}),
     "1 column missing: v"),
    (pd.DataFrame({"e": [1, 2, 7], "a": [":person/age"] * 3, "v": [3, 4, "old"]}),
     "transaction DataFrame, row 2 (entity 7): 'old' (str) is not a valid long value for :person/age"),
    (pd.DataFrame({"e": [1, 2, 7], "a": [":person/age"] * 3, "v": pd.Series([3, None, 5], dtype=object)}),
     "transaction DataFrame, row 1 (entity 2): None (NoneType) is not a valid long value for :person/age"),
    (pd.DataFrame({"e": [1, "x", 3], "a": [":person/age"] * 3, "v": [3, 4, 5]}),
     "transaction DataFrame, row 1: entity id must be a 64-bit integer, got 'x'"),
    (pd.DataFrame({"e": pd.Series([1, 2.5], dtype=object), "a": [":person/age"] * 2, "v": [3, 4]}),  # not entity 2
     "transaction DataFrame, row 1: entity id must be a 64-bit integer, got 2.5"),
    (pd.DataFrame({"e": [1, 2], "a": [":person/age", None], "v": [3, 4]}),
     "transaction DataFrame, row 1 (entity 2): missing attribute name in column a"),
    (pd.DataFrame({"e": [1, 2], "a": [":person/age"] * 2, "v": [3, 4], "added": [True, "no"]}),
     "transaction DataFrame, row 1 (entity 2): column added must be true or false, got 'no'"),
    (pd.DataFrame({"e": [5, 6, 7], "a": [":person/age"] * 3, "v": [3, 4, "x"]}, index=[10, 11, 12]),
     "transaction DataFrame, row 2 (entity 7): 'x' (str) is not a valid long value"),  # the position, not the label
], ids=["extra-column", "missing-column", "value", "missing-value", "entity", "fractional-entity", "no-attribute",
        "added", "indexed"])
def test_a_rejected_pandas_transaction_names_its_row_and_entity(frame, fragment):
    for read in (lambda: prepare(frame, _schema(), spark=None, local_limit=100),
                 lambda: read_wide(frame, _schema(), spark=None, local_limit=100)):  # event time checks it too
        with pytest.raises(TransactionError) as info:
            read()
        assert fragment in str(info.value), str(info.value)


def test_malformed_query_text_is_a_query_error_chained_from_the_edn_error():
    with pytest.raises(QueryError) as info:
        parse_query("[:find ?p\n :where [?p :person/name")
    assert not isinstance(info.value, RuleError)
    assert isinstance(info.value.__cause__, EdnSyntaxError)
    assert "malformed query EDN" in str(info.value) and "line 2" in str(info.value), str(info.value)


@pytest.mark.parametrize("text, cause, fragment", [
    ("[[(reach ?a ?b) [?a :edge ?b]]", EdnSyntaxError, "never closed"),
    ("[[(reach ?a ?b) [?a :edge ?b] [(f ?x) ?y ?z]]]", QueryError, "too many elements"),
])
def test_malformed_rule_text_is_a_rule_error_chained_from_the_cause(text, cause, fragment):
    for parse in (parse_rules, RuleStore().register):
        with pytest.raises(RuleError) as info:
            parse(text)
        assert isinstance(info.value.__cause__, cause), repr(info.value.__cause__)
        assert fragment in str(info.value), str(info.value)


@pytest.mark.parametrize("count, noun, plural_form, expected", [
    (0, "argument", None, "0 arguments"), (1, "argument", None, "1 argument"), (2, "argument", None, "2 arguments"),
    (1, "query", "queries", "1 query"), (3, "query", "queries", "3 queries"), (1000000, "row", None, "1,000,000 rows"),
])
def test_plural_puts_the_noun_in_the_number_of_its_count(count, noun, plural_form, expected):
    from factflow.text import plural

    assert plural(count, noun, plural_form) == expected


def test_a_real_message_counts_in_the_singular():
    """An :in with one input given none: "expects 1 input", never "1 input(s)" or "1 inputs"."""
    from factflow.planner.synthesis import plan_query

    with pytest.raises(QueryError) as info:
        plan_query("[:find ?p :in $ ?n :where [?p :person/age ?n]]", _schema(), RuleStore(), inputs=())
    assert "expects 1 input after $, but got 0" in str(info.value), str(info.value)


@pytest.mark.parametrize("handle", ["RemoteQuery", "AsyncRemoteQuery"])
def test_a_closed_remote_query_refuses_every_public_method_and_property(handle):
    import factflow.client as client
    from factflow.client.messages import QueryState
    from public_members import not_refused

    state = QueryState("friends")
    state.finish(None)  # closed by its client (no connection needed to tell)
    query = getattr(client, handle)(None, state)
    assert not_refused(query, "query friends is closed", exempt=("close", "closed", "name")) == {}
