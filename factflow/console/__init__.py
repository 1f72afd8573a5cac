"""The console: a live view of a running server in the browser, served by the server itself.

``factflow serve`` answers plain HTTP requests on its WebSocket port (``GET /`` on the same
host and port): :mod:`factflow.console.pages` serves the page and its files, behind the
server's token or tenants' tokens when configured (a login page takes the token once and
the server keeps a session for it in an HttpOnly cookie, which then admits the page's
WebSocket connection too). The page is a client of the protocol like any other
(docs/protocol.md): it reads what it shows with read-only ops (``epochs``, ``queries``,
``plan``, ``state``, ``clients``, ``status``), follows a query's rows and diffs with
``interest`` like every client (and ``uninterest`` when it leaves it), and runs one-shot
queries with ``query``. A tenant's page shows only its own interests: the server refuses it
every other op.

How it is built: plain HTML, CSS and one JavaScript file in ``static/``, shipped inside the
package and served as they are (no build step, no CDN, so it works offline), with two
small libraries vendored with their licences in ``static/vendor/``: uPlot for the epoch
charts and dagre for laying out a query's plan as a graph. It stays responsive with
thousands of queries and large results by paging every table and polling at a bounded
rate (see the head of ``static/console.js``).
"""
