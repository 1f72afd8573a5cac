"""Fault injection in CI: two SIGKILLs of a process streaming into a durable engine (see
:mod:`kill_loop`; benchmarks/durability_kills.py runs the longer loop)."""

from __future__ import annotations

from kill_loop import kill_loop


def test_killed_engines_lose_no_acknowledged_epoch_and_apply_none_twice(spark, tmp_path):
    figures = kill_loop(spark, str(tmp_path), kills=2, seed=13, delay=(0.5, 6.0), say=print)
    assert figures["kills"] == 2 and figures["acknowledged"] > 0
