"""The status page: ``page.html`` (package data) with the current data embedded."""
import functools
import html
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from auturi.server.shape import _jsonable

LINE_COLOUR = "#1f77b4"
"""The colour of the page's throughput line and bars (the browser tests look for it)."""


def _script_json(x: Any) -> str:
    """JSON that is safe inside a <script> element."""
    return (json.dumps(_jsonable(x), allow_nan=False).replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


@functools.lru_cache(maxsize=1)
def _template() -> str:
    return resources.files("auturi.server").joinpath("page.html").read_text(encoding="utf-8")


def render_page(status: Mapping[str, Any], trials: Sequence[Mapping[str, Any]], refresh: float = 2.0,
                title: str = "Auturi status", history: Sequence[Mapping[str, Any]] = ()) -> str:
    """The self-contained status page, with the current data embedded (the first paint needs
    no request) and a script that refreshes it every ``refresh`` seconds. ``status``,
    ``trials`` and ``history`` are shaped as ``/status``, ``/trials`` and ``/history`` answer.

    Example:
        >>> page = render_page({"phase": "done", "situation": "tuning", "env": "CartPole-v1"}, [])
        >>> "CartPole-v1" in page and "<svg" in page
        True
    """
    return (_template().replace("__TITLE__", html.escape(title)).replace("__COLOUR__", LINE_COLOUR)
            .replace("__REFRESH__", repr(float(refresh))).replace("__STATUS__", _script_json(status))
            .replace("__TRIALS__", _script_json(trials)).replace("__HISTORY__", _script_json(history)))
