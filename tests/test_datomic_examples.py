"""Examples from Datomic's query reference (`:with`, `not`, `not-join`, `or-join`), on small data.

Keyword values of the originals (``:country/CA``) are strings here: factflow's value
types have no keywords.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def monsters(engine):
    engine.create_attribute(":monster/name", type="string", semantics="one")
    engine.create_attribute(":monster/heads", type="long", semantics="one")
    heads = {"Cerberus": 3, "Medusa": 1, "Cyclops": 1, "Chimera": 1}
    engine.transact([op for e, (name, n) in enumerate(heads.items(), start=1)
                     for op in ([":db/add", e, ":monster/name", name], [":db/add", e, ":monster/heads", n])])
    return engine


def test_with_keeps_equal_values_of_different_entities(monsters):
    with_monster = monsters.query("[:find (sum ?heads) . :with ?monster :where [?monster :monster/heads ?heads]]")
    without = monsters.query("[:find (sum ?heads) . :where [?monster :monster/heads ?heads]]")
    assert with_monster.results() == 6  # 3 + 1 + 1 + 1: one tuple per monster
    assert without.results() == 4  # the set {3, 1}
    monsters.transact([[":db/add", 2, ":monster/heads", 2]])
    assert (with_monster.results(), without.results()) == (7, 6)


@pytest.fixture
def music(engine):
    for name, kind, semantics in [(":artist/name", "string", "one"), (":artist/country", "string", "one"),
                                  (":release/name", "string", "one"), (":release/artists", "ref", "set"),
                                  (":release/year", "long", "one")]:
        engine.create_attribute(name, type=kind, semantics=semantics)
    artists = {1: ("Ann", "US"), 2: ("Bob", "US"), 3: ("Cat", "CA")}
    releases = {10: ("R10", [1], 1970), 11: ("R11", [2], 1971), 12: ("R12", [3], 1972), 13: ("R13", [2], 1973)}
    tx = []
    for e, (name, country) in artists.items():
        tx += [[":db/add", e, ":artist/name", name], [":db/add", e, ":artist/country", country]]
    for e, (name, by, year) in releases.items():
        tx += [[":db/add", e, ":release/name", name], [":db/add", e, ":release/year", year]]
        tx += [[":db/add", e, ":release/artists", a] for a in by]
    engine.transact(tx)
    return engine


def test_not_join_counts_artists_without_a_1970_release(music):
    q = music.query("""[:find (count ?artist) .
                        :where [?artist :artist/name]
                               (not-join [?artist]
                                 [?release :release/artists ?artist]
                                 [?release :release/year 1970])]""")
    assert q.results() == 2  # Bob and Cat; Ann released R10 in 1970
    music.transact([[":db/add", 12, ":release/year", 1970]])  # Cat's release moves to 1970
    assert q.results() == 1


def test_not_counts_artists_outside_canada(music):
    q = music.query("[:find (count ?eid) . :where [?eid :artist/name] (not [?eid :artist/country \"CA\"])]")
    assert q.results() == 2


def test_or_join_counts_releases_by_canadians_or_from_1970(music):
    q = music.query("""[:find (count ?release) .
                        :where [?release :release/name]
                               (or-join [?release]
                                 (and [?release :release/artists ?artist]
                                      [?artist :artist/country "CA"])
                                 [?release :release/year 1970])]""")
    assert q.results() == 2  # R10 (1970) and R12 (Cat, CA)
    music.transact([[":db/add", 2, ":artist/country", "CA"]])  # Bob moves: R11 and R13 join
    assert q.results() == 4
