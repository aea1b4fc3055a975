"""The frozen dispatch table: its rows and records (``table``, ``table_rows``, ``table_records``), the
shapes a bucket stands for (``bucket_shapes``, ``fits``) and the fill rules of untuned buckets
(``fill_nearest``, ``fill_measured``, ``fill_evidence``, ``fill_rank``, ``fill_score``)."""
