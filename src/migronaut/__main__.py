"""``python -m migronaut`` — the same CLI as the ``migronaut`` console script."""

import sys

from migronaut.cli import main

sys.exit(main())
