"""What every part of the command line shares: :class:`CliError` (one line naming the fix,
and an exit code), the exit codes, and the two consoles."""
from __future__ import annotations

from typing import NoReturn

from rich.console import Console

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class CliError(Exception):
    """A user-facing error: one line naming the fix; exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


def stderr() -> Console:
    return Console(stderr=True, highlight=False)


def stdout() -> Console:
    """The report's console. Its width is ``$COLUMNS`` when set, else the terminal's (rich
    asks stdin, stdout and stderr, so ``auturi tune ... | tee log`` still fits the terminal),
    else 80: everything printed reads at 80 columns (short configs, prose wrapped at spaces)."""
    return Console(highlight=False)


def one_line(msg: str, max_lines: int = 3) -> str:
    lines = [ln.strip() for ln in str(msg).strip().splitlines() if ln.strip()]
    return "; ".join(lines[:max_lines]) if lines else "unknown error"


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    raise CliError(message, code)
