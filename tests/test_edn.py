import datetime as dt
import uuid

import pytest

from factflow import EdnSyntaxError
from factflow.edn import EdnList, EdnVector, Keyword, Symbol, read, read_all, write


def test_scalars():
    assert read("42") == 42
    assert read("-7N") == -7
    assert read("1.5") == 1.5
    assert read("2.0M") == 2.0
    assert read("1e3") == 1000.0
    assert read('"a\\"b\\n"') == 'a"b\n'
    assert read("nil") is None
    assert read("true") is True and read("false") is False
    assert read("\\a") == "a" and read("\\newline") == "\n"
    assert read(":person/name") == Keyword(":person/name")
    assert read("?x") == Symbol("?x")


def test_collections_keep_their_kind():
    form = read("[:find ?x :where [?x :a 1] (rule ?x)]")
    assert isinstance(form, EdnVector)
    assert isinstance(form[4], EdnList)
    assert read("{:a 1 :b [2 3]}") == {Keyword(":a"): 1, Keyword(":b"): EdnVector([2, 3])}
    assert read("#{1 2}") == frozenset({1, 2})
    assert EdnList([1]) != EdnVector([1])


def test_comments_discard_and_commas():
    assert read("[1, 2 ; comment\n #_ 99 3]") == EdnVector([1, 2, 3])
    assert read_all("1 2 ; x\n 3") == [1, 2, 3]


def test_tagged_literals():
    stamp = read('#inst "2020-01-02T03:04:05Z"')
    assert stamp == dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert read('#uuid "6ba7b810-9dad-11d1-80b4-00c04fd430c8"') == uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")


@pytest.mark.parametrize("text, fragment", [
    ("[1 2", "never closed"),
    ("(1 2]", "expected ')'"),
    ("]", "unmatched"),
    ('"abc', "string is never closed"),
    ("{:a}", "even number"),
    ("#foo 1", "unknown tag"),
    ("1 2", "after the form"),
    (":", "bad keyword"),
    ("12abc", "bad number"),
    ("#{1 1}", "duplicate"),
])
def test_malformed_edn_names_the_problem_and_position(text, fragment):
    with pytest.raises(EdnSyntaxError) as info:
        read(text)
    assert fragment in str(info.value)
    assert "line 1" in str(info.value)


def test_write_round_trips():
    text = '[:find ?x :in $ ?n :where [?x :a/b "s\\"q"] (r ?x 1.5)]'
    assert read(write(read(text))) == read(text)
