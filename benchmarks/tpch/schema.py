"""The eight TPC-H tables as facts (:class:`factflow.io.tables.Table`).

Every column is an attribute ``:<table>/<column>`` (``:lineitem/l_quantity``); keys are
hashed into entity ids; foreign keys are ``ref`` attributes pointing at the referenced
row's entity (``:lineitem/l_orderkey`` holds the order's entity, whose ``:orders/o_orderkey``
holds the key's number), and a line item's part and supplier together refer to its
``partsupp`` row (``:lineitem/partsupp``).
"""

from __future__ import annotations

from factflow.io.tables import Reference, Table

__all__ = ["TABLES", "KEYED", "STREAM"]


def _fk(table: str, column: str) -> Reference:
    return Reference(table, (column,))


TABLES: dict[str, Table] = {t.name: t for t in [
    Table("region", key=("r_regionkey",)),
    Table("nation", key=("n_nationkey",), references={"n_regionkey": _fk("region", "n_regionkey")}),
    Table("supplier", key=("s_suppkey",), references={"s_nationkey": _fk("nation", "s_nationkey")}),
    Table("customer", key=("c_custkey",), references={"c_nationkey": _fk("nation", "c_nationkey")}),
    Table("part", key=("p_partkey",)),
    Table("partsupp", key=("ps_partkey", "ps_suppkey"),
          references={"ps_partkey": _fk("part", "ps_partkey"), "ps_suppkey": _fk("supplier", "ps_suppkey")}),
    Table("orders", key=("o_orderkey",), references={"o_custkey": _fk("customer", "o_custkey")}),
    Table("lineitem", key=("l_orderkey", "l_linenumber"),
          references={"l_orderkey": _fk("orders", "l_orderkey"), "l_partkey": _fk("part", "l_partkey"),
                      "l_suppkey": _fk("supplier", "l_suppkey"),
                      "partsupp": Reference("partsupp", ("l_partkey", "l_suppkey"))}),
]}

#: The seven relations with primary keys (the Shared Arrangements paper arranges them)
KEYED = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders")
#: The fulfilment events, streamed
STREAM = "lineitem"
