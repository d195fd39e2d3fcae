"""The API: where it listens, how each request is answered, and what it shows.

Owns: the server (TCP and unix sockets, accepting, peer credentials attached to connections),
the handlers, the query parsers, the read models and cached bodies of the views, the web
page's live feed, the Prometheus metrics, the page's files, and which user names each caller
may see (--hide-users).
May import: every layer below it (`patroller.services`, `patroller.state`, `patroller.identify`,
`patroller.observe`, `patroller.config`, `patroller.core`), `patroller.durations`; Tornado,
prometheus_client.
"""
