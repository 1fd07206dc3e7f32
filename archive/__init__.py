"""kernforge.archive: every attempt in one SQLite file (sqlite-utils, WAL), queryable and crash-safe.

* ``store.Archive``: ``create``/``open``, runs, ``record_attempt`` (one transaction per attempt,
  idempotent on ``(run_id, seq)``), content-addressed ``lookup``;
* ``queries``: best per task/GPU and per shape, population for parent selection, lineage, stats,
  full-text search, read-only SQL (mixed into ``Archive``);
* ``schema``: tables, indexes and ordered migrations (``PRAGMA user_version``);
* ``score``: what "best" means; ``content``: code normalisation and environment keys;
* ``records``: the frozen records it takes and returns; ``report``: tables for the CLI.
* ``html_report``: ``kernforge report``'s one-file HTML page (data in ``html_report_data``, plots in
  ``html_report_charts``, headless Chromium in ``browser``).

It imports nothing above it but the verdict types and plain task data.
"""
