"""``--help`` that reads at 80 columns: click's plain layout (option, then its description in
a column of about 45 characters) instead of rich's boxed panels, whose description column
shrank to ~20 characters at 80 columns and cut option names with "…". Text is wrapped at
spaces only: textwrap's default also breaks at hyphens, which splits ``--status-token`` or
``--no-cache`` over two lines.

Built on the classes of the click that typer uses (recent typer releases vendor their own
copy of click), found through :class:`typer.core.TyperCommand`, so it works with either."""
from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import typer.core

__all__ = ["HelpCommand", "HelpGroup"]

_Context: Any = typer.core.TyperCommand.context_class
_Formatter: Any = _Context.formatter_class


def wrap(text: str, width: int, initial: str = "", subsequent: str = "") -> list[str]:
    """``text`` as lines of at most ``width`` (a word longer than that stands alone), breaking
    at spaces only; paragraphs (blank-line separated) stay apart, joined by an empty line."""
    out: list[str] = []
    for para in (p for p in text.split("\n\n") if p.strip()):
        if out:
            out.append("")
        out += textwrap.wrap(" ".join(para.split()), max(10, width), initial_indent=initial,
                             subsequent_indent=subsequent, break_long_words=False, break_on_hyphens=False)
    return out


class HelpFormatter(_Formatter):  # type: ignore[misc, valid-type]
    """click's formatter, wrapping at spaces only (see the module docstring)."""

    def write_text(self, text: str) -> None:
        indent = " " * self.current_indent
        self.write("\n".join(wrap(text, self.width, indent, indent)) + "\n")

    def write_dl(self, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        rows = list(rows)
        first_col = min(max((len(r[0]) for r in rows), default=0), col_max) + col_spacing
        text_width = max(self.width - first_col - 2, 10)
        for first, second in ((r[0], r[1] if len(r) > 1 else "") for r in rows):
            self.write(f"{'':>{self.current_indent}}{first}")
            if not second:
                self.write("\n")
                continue
            if len(first) <= first_col - col_spacing:
                self.write(" " * (first_col - len(first)))
            else:  # a long option: its description starts on the next line
                self.write("\n" + " " * (first_col + self.current_indent))
            lines = wrap(second, text_width) or [""]
            pad = " " * (first_col + self.current_indent)
            self.write(lines[0] + "\n" + "".join(f"{pad}{ln}\n" if ln else "\n" for ln in lines[1:]))


class HelpContext(_Context):  # type: ignore[misc, valid-type]
    formatter_class = HelpFormatter


class HelpCommand(typer.core.TyperCommand):
    """A typer command whose ``--help`` is :class:`HelpFormatter`'s."""

    context_class = HelpContext


class HelpGroup(typer.core.TyperGroup):
    """The ``auturi`` group, its ``--help`` too."""

    context_class = HelpContext
