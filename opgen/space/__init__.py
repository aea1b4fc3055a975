"""The search space of a spec: variants and points under a chip's budgets (``space``), every case
run through every formula (``case_checks``), case sets drawn from a spec's sampling (``case_sample``),
a campaign's buckets and studies (``plan``) and what ``opgen tune --dry-run`` prints (``dry_run``)."""
