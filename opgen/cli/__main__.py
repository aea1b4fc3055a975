"""``python -m opgen.cli``: the ``opgen`` command."""
from .main import main

raise SystemExit(main())
