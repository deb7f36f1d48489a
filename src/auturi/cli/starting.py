"""What the command line says when Ctrl-C lands before any command ran. A module of its own,
importing nothing of auturi's: both the console script's entry (``auturi.cli.main``, while it
loads the app) and the app (while click parses the options) call it."""
from __future__ import annotations

import sys


def interrupted_while_starting() -> None:
    """Ctrl-C before any command ran (loading, parsing the options): one line, exit 130, as
    for an interrupted ``tune``, instead of a traceback through the imports."""
    print("auturi: interrupted (Ctrl-C) while starting, before any command ran; nothing to stop", file=sys.stderr)
    sys.exit(130)
