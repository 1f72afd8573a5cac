"""The factflow server: one engine shared by many clients over WebSocket (protocol in docs/protocol.md).

:mod:`protocol` checks requests and builds messages, :mod:`worker` runs commands against
the engine in one total order (grouping transactions), :mod:`interests` tracks who
listens to which query and attribute, :mod:`outbox` queues each client's messages, and
:mod:`server` ties them to WebSocket connections.
"""

from factflow.server.server import Server, ServerConfig, ServerStartError, ServerThread, serve

__all__ = ["Server", "ServerConfig", "ServerStartError", "ServerThread", "serve"]
