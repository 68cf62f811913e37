"""Fleet diagnosis: every job of a cluster diagnosed into one store, and what recurs (``diagnose fleet``).

Stage: after explain, before present (it runs the pipeline per job and keeps the reports; it never prints).

- ``store``: the SQLite store (WAL, ``PRAGMA user_version`` schema, idempotent inserts, shard merge).
- ``scan``: list the work (files, or Slurm jobs from one sacct call via ``slurm_source``), skip what is stored,
  diagnose the rest in a bounded process pool, commit in batches.
- ``submit``: the same scan as a Slurm array (one shard store per task) and the merge.
- ``epilog``: one ending job, from Slurm's epilog environment, into the store (and its comment).
- ``report`` + ``stats``: the window's classes, nodes (binomial test), users, configs.

Usage: docs/fleet.md.
"""
