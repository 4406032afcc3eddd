"""What a doctor check returns, and the report made of the results.

A check returns an `Outcome` (a status, one line of detail, the command that fixes it) or
raises `Skip`; the runner files it under the check's id as a `Result`. One list of results
feeds the JSON, the plain text and the table, so they agree.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from qnnctl.errors import EXIT_FAILED, EXIT_OK
from qnnctl.words import plural

SCHEMA = 1
OK = "ok"
WARN = "warn"
FAIL = "fail"
SKIP = "skip"
STATUSES = (OK, WARN, FAIL, SKIP)


@dataclass(frozen=True)
class Outcome:
    """What one check found: a status, one line of detail, and the command that fixes it."""

    status: str
    detail: str
    hint: str | None = None


@dataclass(frozen=True)
class Result:
    """An Outcome under the stable id of the check that produced it."""

    id: str
    status: str
    detail: str
    hint: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "detail": self.detail, "hint": self.hint}


class Skip(Exception):
    """Raised by a check that has nothing to look at; becomes a `skip` result."""

    def __init__(self, detail: str, hint: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.hint = hint


def ok(detail: str, hint: str | None = None) -> Outcome:
    return Outcome(OK, detail, hint)


def warn(detail: str, hint: str | None = None) -> Outcome:
    return Outcome(WARN, detail, hint)


def fail(detail: str, hint: str | None = None) -> Outcome:
    return Outcome(FAIL, detail, hint)


def abridged(items: Sequence[str], limit: int = 5) -> str:
    """The first `limit` items, and how many more: how a detail names what it found."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


# -- the report ------------------------------------------------------------------------------


def passed(results: Sequence[Result], strict: bool = False) -> bool:
    bad = {FAIL, WARN} if strict else {FAIL}
    return not any(r.status in bad for r in results)


def exit_code(results: Sequence[Result], strict: bool = False) -> int:
    return EXIT_OK if passed(results, strict) else EXIT_FAILED


def summary(results: Sequence[Result]) -> str:
    counts = {status: sum(1 for r in results if r.status == status) for status in STATUSES}
    words = {OK: f"{counts[OK]} ok", WARN: plural(counts[WARN], "warning"), FAIL: f"{counts[FAIL]} failed",
             SKIP: f"{counts[SKIP]} skipped"}
    return ", ".join(words[s] for s in (FAIL, WARN, OK, SKIP) if counts[s])


def render_json(results: Sequence[Result], strict: bool = False) -> str:
    data = {"schema": SCHEMA, "ok": passed(results, strict), "checks": [r.as_dict() for r in results]}
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def render_text(results: Sequence[Result]) -> str:
    """Plain aligned columns, for logs and pipes; a hint goes on the line under its check, an ok
    one's too (`qnnctl use VERSION` on an SDK chosen only because it is the newest installed)."""
    width = max((len(r.id) for r in results), default=0)
    indent = " " * (6 + width + 2)
    lines = []
    for r in results:
        lines.append(f"{r.status:<6}{r.id:<{width}}  {r.detail}")
        if r.hint:
            lines.append(f"{indent}hint: {r.hint}")
    lines.append(summary(results))
    return "\n".join(lines) + "\n"


_STYLES = {OK: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim"}


def render_table(results: Sequence[Result], width: int | None = None) -> str:
    """The same rows as render_text, as a rich table with colours (for a terminal)."""
    # lazy: rich is for a terminal only; JSON and piped text do without it.
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for r in results:
        detail = Text(r.detail)
        if r.hint:
            detail.append("\nhint: " + r.hint, style="cyan")
        table.add_row(Text(r.status, style=_STYLES[r.status]), r.id, detail)
    buffer = io.StringIO()
    width = width or shutil.get_terminal_size().columns
    console = Console(file=buffer, force_terminal=True, width=width, highlight=False, soft_wrap=False)
    console.print(table)
    console.print(summary(results))
    return buffer.getvalue()
