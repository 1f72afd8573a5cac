"""Rendering a statement from named subqueries (no Spark)."""

from factflow.dataflow.statement import Statement


def test_a_subquery_used_once_is_written_in_place_and_a_shared_one_in_the_with_clause():
    s = Statement()
    base = s.define("SELECT 1 AS `x`, 1L AS `_diff`")
    kept = s.define(f"SELECT * FROM {base} WHERE `x` > 0")
    pair = s.define(f"SELECT l.`x` FROM {kept} l JOIN {kept} r ON l.`x` = r.`x`")
    sql = s.render(f"SELECT * FROM {pair}")
    assert sql == ("WITH __r2 AS (SELECT * FROM (SELECT 1 AS `x`, 1L AS `_diff`) __r1 WHERE `x` > 0)\n"
                   "SELECT * FROM (SELECT l.`x` FROM __r2 l JOIN __r2 r ON l.`x` = r.`x`) __r3")


def test_a_subquery_written_in_place_keeps_the_alias_it_is_given_or_takes_its_name():
    s = Statement()
    a = s.define("SELECT 1 AS `k`")
    b = s.define("SELECT 2 AS `k`")
    c = s.define("SELECT 3 AS `k`")
    sql = s.render(f"SELECT * FROM {a} t LEFT SEMI JOIN {b} ON t.`k` > 0 UNION ALL SELECT * FROM {c} LIMIT 1")
    assert sql == ("SELECT * FROM (SELECT 1 AS `k`) t LEFT SEMI JOIN (SELECT 2 AS `k`) __r2 ON t.`k` > 0 "
                   "UNION ALL SELECT * FROM (SELECT 3 AS `k`) __r3 LIMIT 1")


def test_a_subquery_named_as_a_qualifier_stays_in_the_with_clause():
    s = Statement()
    a = s.define("SELECT 1 AS `k`")
    assert s.render(f"SELECT {a}.`k` FROM {a}") == "WITH __r1 AS (SELECT 1 AS `k`)\nSELECT __r1.`k` FROM __r1"


def test_names_inside_strings_and_quoted_identifiers_are_text():
    s = Statement()
    a = s.define("SELECT 'x' AS `__r1`")
    b = s.define(f"SELECT * FROM {a} WHERE `__r1` <> '__r1' AND `__r1` <> 'it\\'s __r1'")
    assert s.render(f"SELECT * FROM {b}") == (
        "SELECT * FROM (SELECT * FROM (SELECT 'x' AS `__r1`) __r1 "
        "WHERE `__r1` <> '__r1' AND `__r1` <> 'it\\'s __r1') __r2")


def test_a_statement_without_names_is_left_as_it_is():
    assert Statement().render("SELECT 1") == "SELECT 1"
