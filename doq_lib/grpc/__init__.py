"""The gRPC API (L5): the ``queue.DOQ`` service of SPEC §4 over
:class:`doq_lib.service.Service`, served in the node's event loop.

The package: ``api`` (the RPC handlers, failures to statuses, API keys), ``controls`` (the
operator RPCs), ``requests`` (reading and checking requests, building answers), ``streams``
(a stream's inbox and the DequeueStream subscription), ``server`` (the listener and its
bounds), ``connection`` (one HTTP/2 connection, by h2) and ``calls`` (one call's state and
gRPC's framing on top of HTTP/2).
"""
