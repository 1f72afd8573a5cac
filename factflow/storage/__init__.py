"""Durable state: the write-ahead log, checkpoints and the state directory they live in.

Imports ``model`` and ``errors`` (and Spark, to write large sets of facts); never
``engine``, which turns arrangements into what is stored here and back
(:mod:`factflow.engine.durability`). docs/storage.md describes the files.
"""
