"""Running one point in isolation: the worker processes (``worker``) that die with their parent
(``lifetime``), the timing protocol (``bench``), the accuracy criteria (``accuracy``) and bf16 in the
Triton interpreter (``interpreter``)."""
