"""Ingestion: the graphs a run trains on, from an organisation's own tables to the aligned,
partitioned federation.

- :mod:`.table_file`, :mod:`.party_tables`: an organisation's CSV/Parquet tables, read and checked;
- :mod:`.party`: one organisation's prepared folder (the worker's on-disk format, docs/data.md);
- :mod:`.aligned`, :mod:`.shared_split`: a federation of such folders once aligned, and its split;
- :mod:`.partition`: one client's block of a graph (vertical partitioning);
- :mod:`.planetoid`, :mod:`.csbm`: the benchmark graphs (Cora, CiteSeer, PubMed) and synthetic ones.
- :mod:`.party_graphs`: a synthetic CSBM whose parties each draw their own graph (they differ).
"""
