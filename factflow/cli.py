"""The ``factflow`` command line: ``factflow [-v] COMMAND ...``.

Each command is a handler ``handler(args) -> exit status`` attached to its subparser in
:func:`build_parser` with ``set_defaults(handler=...)``; a new command is one handler and
one subparser. A :class:`~factflow.errors.FactflowError` from a handler prints
``factflow: <message>`` on stderr and exits with status 1.

``factflow serve [--host H] [--port P] [--master URL] [--token-file FILE] [--tenants FILE]`` runs the
server in the foreground (it prints ``factflow serving ws://H:P`` when ready). Commands
talking to a server take its ``ws://HOST:PORT/`` address and ``--token-file``::

    factflow tx URL EDN            apply a transaction (EDN text, or - for stdin); prints the epoch
    factflow query URL EDN         print the rows of a query as a table
        [--inputs JSON] [--name NAME] [--follow]
                                   --follow: then print every change, "epoch N  + row" or
                                   "epoch N  - row", until Ctrl-C
    factflow status URL [--json]   the server's epoch, clients and queries
    factflow explain URL NAME      the plan of an installed query

``factflow load PATH --state-dir DIR [--format F] [--entity COLUMN] --attr ATTR=COLUMN[:TYPE[:SEM]] ...
[--option KEY=VALUE ...]`` reads a file with Spark and applies it as one epoch to the
durable state in DIR (see :meth:`factflow.Engine.load`); an ``--attr`` with a type creates
its attribute if it does not exist. A server holding DIR must be stopped first (one engine
per directory).

``factflow repair DIR [--accept-data-loss]`` reads a state directory back without Spark and
prints its epoch, or the damage that keeps it from opening (exit status 1); with
``--accept-data-loss`` it cuts the write-ahead log at the damage and prints which
acknowledged epochs were dropped (docs/storage.md, "Recovery").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, Iterable, Sequence

from factflow import __version__
from factflow.engine.session import LOG_LEVEL_VARIABLE
from factflow.errors import FactflowError
from factflow.text import plural

__all__ = ["main", "build_parser"]


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` (default: the process arguments); returns the exit status."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if args.verbose:  # an explicit FACTFLOW_SPARK_LOG wins
        os.environ.setdefault(LOG_LEVEL_VARIABLE, "WARN" if args.verbose == 1 else "INFO")
    try:
        return args.handler(args)
    except FactflowError as exc:
        print(f"factflow: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command."""
    verbose = "log every epoch and its Spark jobs, and Spark's warnings (-vv: Spark's INFO log too)"
    parser = argparse.ArgumentParser(prog="factflow", description="Incremental Datalog on Apache Spark.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help=verbose)
    common = argparse.ArgumentParser(add_help=False)  # -v after the command too, without resetting the count
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=verbose)
    remote = argparse.ArgumentParser(add_help=False, parents=[common])
    remote.add_argument("url", help="the server's address, ws://HOST:PORT/")
    remote.add_argument("--token-file", metavar="FILE", help="a file holding the server's token")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub = commands.add_parser("version", parents=[common], help="print the version")
    sub.set_defaults(handler=version)

    sub = commands.add_parser("demo", parents=[common], help="run the demo (a social network kept live)")
    sub.add_argument("--data", help="LDBC SNB directory (default: ../shared/data/ldbc-snb-tiny or the bundled subset)")
    sub.add_argument("--master", help="Spark master (default: local[*])")
    sub.add_argument("--server", action="store_true", help="the demo over the server: two clients share one query")
    sub.set_defaults(handler=demo)

    sub = commands.add_parser("serve", parents=[common], help="serve one engine to many clients over WebSocket")
    sub.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --token-file)")
    sub.add_argument("--port", type=int, default=6262, help="port (default 6262; 0 picks a free one)")
    sub.add_argument("--master", help="Spark master (default: local[*])")
    sub.add_argument("--token-file", metavar="FILE", help="a file holding the token clients must present")
    sub.add_argument("--tenants", metavar="FILE",
                     help="a JSON file of tenants and admins, each with the SHA-256 of its token "
                          "(see factflow.server.tenants); with --token-file too, that token is an admin's")
    sub.add_argument("--state-dir", metavar="DIR", help="keep the engine's state durable in DIR, a path or an object "
                                                      "store URI such as s3://bucket/path (see docs/storage.md)")
    _storage_option_argument(sub)
    sub.add_argument("--max-frame-mib", type=float, default=16, help="largest frame accepted, in MiB (default 16)")
    sub.add_argument("--max-waiting-rows", type=int, default=1_000_000,
                     help="change rows that may wait for a slow client before it is dropped (default 1000000)")
    sub.set_defaults(handler=serve)

    sub = commands.add_parser("tx", parents=[remote], help="apply a transaction on a server")
    sub.add_argument("edn", help="the transaction as EDN, [[:db/add e a v] ...], or - to read it from stdin")
    sub.set_defaults(handler=tx)

    sub = commands.add_parser("query", parents=[remote], help="print a query's rows, and with --follow its changes")
    sub.add_argument("edn", help="the query as EDN, [:find ... :where ...]")
    sub.add_argument("--inputs", type=_json_array, default=[], metavar="JSON",
                     help="the values of the :in bindings after $, as a JSON array")
    sub.add_argument("--name", help="interest under this name (shared with clients of the same query)")
    sub.add_argument("--follow", action="store_true", help="then print every change until Ctrl-C")
    sub.set_defaults(handler=query)

    sub = commands.add_parser("status", parents=[remote], help="print a server's epoch, clients and queries")
    sub.add_argument("--json", action="store_true", help="print the whole status (with stats) as JSON")
    sub.set_defaults(handler=status)

    sub = commands.add_parser("load", parents=[common], help="load a file (any Spark source) into a state directory")
    sub.add_argument("path", nargs="+", help="files or a directory to read")
    sub.add_argument("--state-dir", metavar="DIR", required=True,
                     help="the durable engine's state directory (a path or an object store URI)")
    _storage_option_argument(sub)
    sub.add_argument("--format", default="csv", help="Spark source format: csv (default), json, parquet, orc, ...")
    sub.add_argument("--entity", default="id", metavar="COLUMN", help="the column of entity ids (default id)")
    sub.add_argument("--attr", type=_attribute_spec, action="append", required=True, metavar="ATTR=COLUMN[:TYPE[:SEM]]",
                     help="load COLUMN as attribute ATTR; with TYPE (and semantics, default set) create ATTR "
                          "if it does not exist (repeatable)")
    sub.add_argument("--option", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                     help="a reader option, e.g. header=true, sep='|' (repeatable)")
    sub.add_argument("--master", help="Spark master (default: local[*])")
    sub.set_defaults(handler=load)

    sub = commands.add_parser("repair", parents=[common],
                              help="check a state directory; with --accept-data-loss, cut its log at damage")
    sub.add_argument("state_dir", metavar="DIR",
                     help="the durable engine's state directory, a path or an object store URI (no engine may hold it)")
    _storage_option_argument(sub)
    sub.add_argument("--accept-data-loss", action="store_true",
                     help="cut the write-ahead log at the damage found, dropping the epochs after it")
    sub.set_defaults(handler=repair)

    sub = commands.add_parser("explain", parents=[remote], help="print the plan of a query installed on a server")
    sub.add_argument("name", help="the query's name")
    sub.set_defaults(handler=explain)
    return parser


# ------------------------------------------------------------ commands
def version(args: argparse.Namespace) -> int:
    """``factflow version``: print the version."""
    print(__version__)
    return 0


def demo(args: argparse.Namespace) -> int:
    """``factflow demo``: run the demo (see :mod:`factflow.demo`)."""
    from factflow.demo import run_demo, run_server_demo

    if args.server:
        run_server_demo(args.data, args.master)
    else:
        run_demo(args.data, args.master).close()
    return 0


def serve(args: argparse.Namespace) -> int:
    """``factflow serve``: run the server in the foreground until Ctrl-C, SIGTERM or ``shutdown``."""
    from factflow.server import ServerConfig, serve as run_server
    from factflow.server.tenants import Tenants

    config = ServerConfig(max_frame_bytes=int(args.max_frame_mib * 1024 * 1024), max_waiting_rows=args.max_waiting_rows)
    tenants = Tenants.load(args.tenants) if args.tenants else None
    return run_server(args.host, args.port, master=args.master, token=_read_token(args.token_file),
                      state_dir=args.state_dir, config=config, announce=lambda line: print(line, flush=True),
                      storage_options=dict(args.storage_option) or None, tenants=tenants)


def tx(args: argparse.Namespace) -> int:
    """``factflow tx URL EDN``: apply a transaction; prints its epoch."""
    text = sys.stdin.read() if args.edn == "-" else args.edn
    with _connect(args) as client:
        print(f"epoch {client.transact(text)}")
    return 0


def query(args: argparse.Namespace) -> int:
    """``factflow query URL EDN``: print the rows as a table; with ``--follow``, then every change."""
    with _connect(args) as client:
        if not (args.follow or args.name):  # a one-shot answer: no interest
            answer = client.request("query", query=args.edn, inputs=args.inputs or None)
            _print_table(answer["columns"], answer["rows"])
            return 0
        with client.query(args.edn, name=args.name, inputs=args.inputs) as remote:
            updates = remote.updates(initial=True)
            epoch, current = next(updates)
            _print_table(remote.columns, [row for row, n in current for _ in range(n)], epoch)
            if not args.follow:
                return 0
            try:
                for epoch, changes in updates:
                    for row, diff in sorted(changes, key=lambda change: change[1] > 0):  # retractions first
                        sign = ("+" if diff > 0 else "-") + (str(abs(diff)) if abs(diff) != 1 else "")
                        print(f"epoch {epoch}  {sign} {'  '.join(_cell(v) for v in row)}", flush=True)
            except KeyboardInterrupt:  # the way to stop following
                pass
    return 0


def status(args: argparse.Namespace) -> int:
    """``factflow status URL``: the server's epoch, clients and queries (``--json``: everything)."""
    with _connect(args) as client:
        report = client.status()
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    print(f"epoch    {report['epoch']}")
    print(f"clients  {report['clients']}")
    print(f"queries  {len(report['queries'])}")
    width = max((len(name) for name in report["queries"]), default=0)
    for name, count in sorted(report["queries"].items()):
        print(f"  {name.ljust(width)}  {plural(count, 'client')}")
    return 0


def explain(args: argparse.Namespace) -> int:
    """``factflow explain URL NAME``: the plan of an installed query."""
    with _connect(args) as client:
        print(client.explain(args.name))
    return 0


def load(args: argparse.Namespace) -> int:
    """``factflow load PATH --state-dir DIR --attr ATTR=COLUMN[:TYPE[:SEM]] ...``: one epoch of
    facts from a file, into a durable engine (see :meth:`factflow.Engine.load`); prints what it applied."""
    from factflow import Engine

    with Engine(master=args.master, state_dir=args.state_dir, storage_options=dict(args.storage_option) or None) as db:
        for attribute, _, value_type, semantics in args.attr:
            if value_type is not None:
                db.create_attribute(attribute, type=value_type, semantics=semantics)
        path = args.path[0] if len(args.path) == 1 else args.path
        report = db.load(path, format=args.format, entity=args.entity,
                         attributes={attribute: column for attribute, column, _, _ in args.attr},
                         options=dict(args.option))
    facts = ", ".join(f"{name} {n}" for name, n in report.facts.items())
    print(f"epoch {report.epoch}: {plural(report.rows, 'row')}, facts {facts} ({report.seconds:.1f}s)")
    return 0


def repair(args: argparse.Namespace) -> int:
    """``factflow repair DIR [--accept-data-loss]``: read the state directory back without
    Spark; print what it holds, or the damage found and what cutting the log there would
    drop (exit status 1), and with ``--accept-data-loss`` cut it there and print what was dropped."""
    from factflow.storage.store import StateStore

    store = StateStore(args.state_dir, dict(args.storage_option) or None)
    try:
        recovered = store.recover(accept_data_loss=args.accept_data_loss)
    except FactflowError as exc:
        store.close()
        print(f"factflow: {exc}", file=sys.stderr)
        return 1
    store.close(recovered.epoch)
    if recovered.dropped is not None:
        print(f"cut the write-ahead log at {recovered.dropped.damage}: {recovered.dropped.description}")
    for message in recovered.refused + recovered.torn:
        print(message)
    print(f"{args.state_dir}: epoch {recovered.epoch} (checkpoint {recovered.checkpoint}, "
          f"{plural(recovered.log_records, 'log record')} after it)")
    if recovered.unconfirmed is not None:
        print(f"the log ends with guessed epoch {recovered.unconfirmed[0]}, not yet checked: the next "
              "opening applies its transaction again")
    return 0


# ------------------------------------------------------------ helpers
def _attribute_spec(text: str) -> tuple[str, str, str | None, str]:
    """The value of ``--attr``: ``(attribute, column, type or None, semantics)``."""
    attribute, sep, rest = text.partition("=")
    parts = rest.split(":")
    if not sep or not attribute or not parts[0] or len(parts) > 3:
        raise argparse.ArgumentTypeError(f"expected ATTR=COLUMN[:TYPE[:SEMANTICS]], got {text!r}")
    return attribute, parts[0], parts[1] if len(parts) > 1 else None, parts[2] if len(parts) > 2 else "set"


def _storage_option_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--storage-option KEY=VALUE`` (repeatable) to ``parser``."""
    parser.add_argument("--storage-option", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the state directory's store client, e.g. endpoint_url=http://HOST:PORT "
                             "(repeatable; the store's standard environment, such as AWS_*, works too)")


def _key_value(text: str) -> tuple[str, str]:
    """The value of ``--option``: ``(key, value)``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _connect(args: argparse.Namespace):
    """A client of the server ``args.url``, with the token of ``args.token_file`` if given."""
    from factflow.client import Client

    return Client(args.url, token=_read_token(args.token_file))


def _read_token(path: str | None) -> str | None:
    """The token held in the file ``path`` (surrounding whitespace removed), or None without a file."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().strip()
    except OSError as exc:
        raise FactflowError(f"cannot read the token file {path}: {exc.strerror or exc}") from exc


def _json_array(text: str) -> list:
    """The value of ``--inputs``."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError(f"not a JSON array: {text}")
    return value


def _cell(value: Any) -> str:
    """A value as a table shows it: strings bare, nil and booleans as in EDN, collections as vectors."""
    if isinstance(value, str):
        return value
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(_cell(v) for v in value) + "]"
    return str(value)


def _print_table(columns: Sequence[str], rows: Iterable[Sequence], epoch: int | None = None) -> None:
    """Rows under their column names, aligned, sorted where they compare; then the count."""
    rows = list(rows)
    try:
        rows.sort()
    except TypeError:  # values that do not compare: the server's order
        pass
    cells = [list(columns)] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    count = plural(len(rows), "row")
    print(f"({count}, epoch {epoch})" if epoch is not None else f"({count})", flush=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
