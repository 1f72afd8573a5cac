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


def _doubling(s: Statement, levels: int, width: int = 100) -> str:
    """A chain of ``levels`` subqueries, each reading the one before twice: inlined whole,
    the first is copied 2 ** levels times."""
    name = s.define(f"SELECT {' + '.join(['1'] * width)} AS `x`, 1L AS `_diff`")
    for _ in range(levels):
        name = s.define(f"SELECT l.`x` FROM {name} l JOIN {name} r ON l.`x` = r.`x`")
    return name


def test_entries_are_inlined_while_the_statement_inlined_whole_stays_short():
    s = Statement()
    sql = s.render(f"SELECT * FROM {_doubling(s, 3)}")
    assert "rand()" not in sql


def test_entries_whose_inlining_copies_much_text_are_computed_once(monkeypatch):
    import factflow.dataflow.statement as statement
    monkeypatch.setattr(statement, "INLINED_STATEMENT_CHARACTERS", 10_000)
    monkeypatch.setattr(statement, "INLINED_ENTRY_CHARACTERS", 1_000)
    s = Statement()
    sql = s.render(f"SELECT * FROM {_doubling(s, 8)}")
    entries = dict(line.removeprefix("WITH ").rstrip(",").split(" AS ", 1) for line in sql.split("\n")[:-1])
    once = {name for name, text in entries.items() if text.endswith(" WHERE rand() >= 0)")}
    # __r8 .. __r5 (65 characters each) are read 2, 4, 8, 16 times: inlined; __r4, read 32
    # times, would copy 2,015 characters, so it is computed once; then __r3 and __r2 are read
    # 2 and 4 times, and __r1 (310 characters) 8 times: computed once too
    assert once == {"__r1", "__r4"}
    assert entries["__r4"].startswith("(SELECT * FROM (SELECT l.`x` FROM __r3 l JOIN __r3 r")


def test_an_entry_read_twice_that_probes_a_trace_is_computed_once_in_a_short_statement():
    s = Statement()
    looked_up = s.define("SELECT `k`, `_diff` FROM ff_q17")  # a probe's view (EpochContext.register)
    kept = s.define(f"SELECT * FROM {looked_up} WHERE `k` > 0")
    plain = s.define("SELECT 1 AS `k`, 1L AS `_diff`")
    sql = s.render(f"SELECT l.`k` FROM {kept} l JOIN {kept} r ON l.`k` = r.`k` "
                   f"JOIN {plain} a ON a.`k` = l.`k` JOIN {plain} b ON b.`k` = r.`k`")
    entries = dict(line.removeprefix("WITH ").rstrip(",").split(" AS ", 1) for line in sql.split("\n")[:-1])
    # the entry over the probe is read twice: computed once, and the probe runs once; the
    # constant one is read twice too, but costs nothing to copy: inlined as before
    assert set(entries) == {"__r2", "__r3"}
    assert entries["__r2"].endswith(" WHERE rand() >= 0)")
    assert "rand()" not in entries["__r3"]


def test_a_view_definition_writes_every_subquery_in_place():
    """The definition of a view (``inline``) has no ``WITH`` clause: a shared subquery is
    copied where it is read, and one named as a qualifier keeps its name as the alias."""
    s = Statement()
    base = s.define("SELECT 1 AS `x`")
    pair = s.define(f"SELECT l.`x` FROM {base} l JOIN {base} r ON l.`x` = r.`x`")
    assert s.render(f"SELECT * FROM {pair}", inline=True) == (
        "SELECT * FROM (SELECT l.`x` FROM (SELECT 1 AS `x`) l JOIN (SELECT 1 AS `x`) r ON l.`x` = r.`x`) __r2")
    assert s.render(f"SELECT {base}.`x` FROM {base}", inline=True) == "SELECT __r1.`x` FROM (SELECT 1 AS `x`) __r1"
