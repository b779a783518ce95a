"""The benchmarks, one module each, run from the checkout's root as ``python -m bench.NAME``
(docs/results.md names each one's command and shows its results)."""
