"""Where tuning results live: the records files (``records``), the studies' journal, SQLite or
PostgreSQL storage (``storage``, ``db``), the buckets hosts claim (``claims``) and the records a shared
campaign keeps in its database (``db_records``)."""
