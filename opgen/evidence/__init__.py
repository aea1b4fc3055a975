"""The commands that read what was measured and frozen: ``opgen bench`` (``compare``), ``opgen
host-time`` (``host_time``, ``launches``), ``opgen resources`` (``resources``, ``cuda_compile``,
``frontend``), ``opgen explain`` (``explain``), ``opgen records`` (``report``), ``opgen replay``
(``replay``), ``opgen report`` (``review_data``, ``plots``, ``review_page``)."""
