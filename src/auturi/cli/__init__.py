"""The ``auturi`` command line, split by role:

- :mod:`auturi.cli.app`: the commands (``tune`` is built on :func:`auturi.tune`, ``show``,
  ``bench``) and their exit codes;
- :mod:`auturi.cli.policies`: ENV specs, the env's spaces, ``--policy`` (built-in or a
  saved SB3 model);
- :mod:`auturi.cli.knobs`: ``--start``, ``--devices``, ``--address``/``--worker-timeout``;
- :mod:`auturi.cli.render`: the tables, the choice line, the time splits and the progress bar;
- :mod:`auturi.cli.common`: :class:`CliError` and the consoles.

``auturi tune ENV`` measures layouts for ENV on this machine and prints the fastest;
``auturi show result.json`` prints a saved result again; ``auturi bench ...`` runs the
benchmark suite of a source checkout. See ``docs/cli.md``.

Importing this package imports neither typer nor rich: :func:`main` does, and says which
package to install when one is missing. Workers start with ``forkserver`` without the
caller's ``__main__``; nothing here runs at import.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["CliError", "app", "build_policy", "config_line", "main", "resolve_env_spec"]

# name -> the submodule defining it (loaded on first use: see the module docstring)
_LAZY = {"CliError": "common", "app": "app", "build_policy": "policies", "resolve_env_spec": "policies",
         "_probe_spaces": "policies:probe_spaces", "config_line": "render", "NOTES": "render", "SOURCES": "render",
         "print_result": "render", "trials_table": "render", "notes_help": "render"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'auturi.cli' has no attribute {name!r}")
    module, _, attr = _LAZY[name].partition(":")
    return getattr(importlib.import_module(f"auturi.cli.{module}"), attr or name)


def main(argv: list[str] | None = None) -> None:
    """The console script ``auturi`` (see :func:`auturi.cli.app.main`). When typer or rich is
    missing (an install that skipped dependencies) it says what to install, in one line."""
    try:
        from auturi.cli.app import main as app_main
    except ModuleNotFoundError as e:
        if e.name not in ("typer", "rich", "click"):
            raise
        print(f"auturi: error: the command line needs {e.name}, which is not installed: pip install "
              f"\"auturi[cli]\" (or pip install typer rich)", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C while the command line loads: nothing ran, nothing to stop
        from auturi.cli.starting import interrupted_while_starting

        interrupted_while_starting()
    app_main(argv)

