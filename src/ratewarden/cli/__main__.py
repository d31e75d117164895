"""``python -m ratewarden.cli``: the ``ratewarden`` command."""

from . import main

raise SystemExit(main())
