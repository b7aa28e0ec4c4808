"""``python -m tilewise`` runs the command line (see ``tilewise.cli``)."""

import sys

from tilewise.cli import main

sys.exit(main())
