"""The egress proxy: the only route out of a sandbox, and the record of every attempt.

Guarantee: every network decision is made by ``firstrun.policy.network``
(name first, then every resolved address) and every request or tunnel leaves
one ``EgressRecord``. The public entry point is
``firstrun.proxy.server.EgressProxy``; ``request`` and ``tls`` are the pure
judgements it applies, ``tunnel`` moves bytes, ``records`` writes them down
and ``errors`` is where foreign errors become firstrun's.
"""
