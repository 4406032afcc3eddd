"""What qnnctl says to people: the "qnnctl" logger and its -v/-q, the labels on stderr, and how
a failure is told (a line, a hint, an exit code). No click here: `lower`'s lean path
(qnnctl.commands.leanlower) says things as the full command line does.

stdout carries only what scripts consume (paths, exports, JSON); everything for people goes to
stderr through logging.
"""

from __future__ import annotations

import logging
import os
import sys

from qnnctl.errors import EXIT_FAILED, EXIT_INTERRUPTED, INTERRUPTED, QnnctlError
from qnnctl.net.urls import redact_text
from qnnctl.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


class _Logger:
    """The "qnnctl" logger, set up on first use with this invocation's -v/-q (or without them,
    for what is said before the command line is parsed)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_setup_logging(), name)


log = _Logger()
# This invocation's -v/-q, until the logger is set up with them.
_pending_verbosity: dict[str, int] = {}
# This invocation's -v and -q so far, given before the command's name and after it.
verbosity = {"verbose": 0, "quiet": 0}


def configure_logging(verbose: int, quiet: int, more: bool = False) -> None:
    """Take this invocation's -v/-q (`more`: some more, given after a command's name)."""
    if not more:
        verbosity.update(verbose=0, quiet=0)
    verbosity["verbose"] += verbose
    verbosity["quiet"] += quiet
    _pending_verbosity.update(verbosity)
    _setup_logging()


def _setup_logging() -> logging.Logger:
    """The "qnnctl" logger, with a stderr handler for this invocation's -v/-q in place."""
    root = logging.getLogger("qnnctl")
    if not _pending_verbosity:
        return root

    class StderrFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            message = record.getMessage()
            if record.levelno >= logging.ERROR:
                return f"{label('error')} {message}"
            if record.levelno >= logging.WARNING:
                return f"{label('warning')} {message}"
            return f"qnnctl: {message}"

    level = logging.INFO - 10 * _pending_verbosity["verbose"] + 10 * _pending_verbosity["quiet"]
    _pending_verbosity.clear()
    if os.environ.get("QNNCTL_DEBUG"):
        level = logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(StderrFormatter())
    root.handlers[:] = [handler]
    # -v is debug and -qq errors only; more of either changes nothing more.
    root.setLevel(max(logging.DEBUG, min(level, logging.ERROR)))
    root.propagate = False
    return root


# The word of each label on stderr, in colour on a terminal (ANSI SGR): as doctor's table.
_LABEL_COLOURS = {"error": "1;31", "unexpected error": "1;31", "warning": "33", "hint": "36"}


def _colour_on_stderr() -> bool:
    """Colour only on a terminal, and never with NO_COLOR set to anything (no-color.org)."""
    return not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb" and sys.stderr.isatty()


def label(kind: str) -> str:
    """`qnnctl: error:` and its kin, the one style of every error, warning and hint on stderr."""
    if not _colour_on_stderr():
        return f"qnnctl: {kind}:"
    return f"qnnctl: \x1b[{_LABEL_COLOURS[kind]}m{kind}:\x1b[0m"


def say_error(message: str, hint: str | None = None, kind: str = "error") -> None:
    lines = f"{label(kind)} {message}\n" + (f"{label('hint')} {hint}\n" if hint else "")
    if sys.stderr is not None:
        sys.stderr.write(lines)
        sys.stderr.flush()


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty() and bool(log.isEnabledFor(logging.INFO))


def interrupted_line() -> str:
    """What a Ctrl-C leaves on stderr: on a terminal, over the `^C` it echoed (at the start of a
    line: every line ends with one)."""
    erase = "\r\x1b[K" if sys.stderr.isatty() and os.environ.get("TERM") != "dumb" else ""
    return f"{erase}qnnctl: {INTERRUPTED}"


def tell_failure(exc: BaseException) -> int:
    """Say what `exc` means for the person who ran qnnctl, on stderr; the exit code it ends with.
    The one error boundary's common part (qnnctl.cli adds click's own errors)."""
    if isinstance(exc, QnnctlError):
        say_error(exc.message, exc.hint)
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        if sys.stderr is not None:
            sys.stderr.write(interrupted_line() + "\n")
        return EXIT_INTERRUPTED
    if isinstance(exc, OSError):
        # The file system said no (permissions, a read-only or full disk): name the path.
        where = f" {exc.filename}" if exc.filename else ""
        say_error(f"cannot use{where}: {exc.strerror or exc}", "check its permissions and free space, or point "
                  "QNNCTL_CACHE_DIR at a folder you can write to")
        return EXIT_FAILED
    if os.environ.get("QNNCTL_DEBUG") or log.isEnabledFor(logging.DEBUG):
        sys.__excepthook__(type(exc), exc, exc.__traceback__)  # Python's own report, on stderr
    else:
        # Whatever raised it may have put a URL with a token in its message.
        say_error(f"{type(exc).__name__}: {redact_text(str(exc))} (run with -v or QNNCTL_DEBUG=1 for the "
                  "traceback)", kind="unexpected error")
    return EXIT_FAILED
