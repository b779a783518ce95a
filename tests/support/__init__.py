"""What the tests and the benchmarks start around the product: a throwaway PostgreSQL cluster
(``postgres``), ``glasu serve`` replicas behind HAProxy (``replicas``) and real workers against
the service app in one process (``asgi_federation``). Imported as ``tests.support.NAME`` with the
repository root on the import path (pytest's ``pythonpath``; ``python -m`` from the root)."""
