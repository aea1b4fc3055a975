"""``opgen tune``: a campaign's set-up (``campaign``), budgets and rules (``settings``), the steps in
order (``tune``): the optuna loop (``search``, ``measure``), the side-by-side re-measure
(``side_by_side``), the cross-check (``cross_check``), the measured fill (``measure_fill``), the work
split over devices or hosts (``shard``)."""
