"""The ``factflow`` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from factflow import __version__
from factflow.engine.session import LOG_LEVEL_VARIABLE
from factflow.errors import FactflowError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``factflow demo`` runs the demo; ``factflow version`` prints the version."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="factflow", description="Incremental Datalog on Apache Spark.")
    parser.add_argument("command", choices=["demo", "version"], help="what to run")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log every epoch and its Spark jobs, and Spark's warnings (-vv: Spark's INFO log too)")
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if args.verbose:  # an explicit FACTFLOW_SPARK_LOG wins
        os.environ.setdefault(LOG_LEVEL_VARIABLE, "WARN" if args.verbose == 1 else "INFO")
    if args.command == "version":
        print(__version__)
        return 0
    from factflow.demo import main as demo

    try:
        return demo(rest)
    except FactflowError as exc:
        print(f"factflow: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
