"""``python -m migronaut.devserver``: serve until SIGINT/SIGTERM (see :func:`~.serve.main`)."""

import sys

from migronaut.devserver.serve import main

if __name__ == "__main__":
    sys.exit(main())
