"""The project pin: a `.qnn-version` file naming the SDK a project uses.

The first line that is not a comment names the version (`qnnctl.sdk.select.read_pin`); a second one
may name the components the project needs (`host,android,hexagon-v75`, see
qnnctl.sdk.components), which `qnnctl install` then installs for the pinned version.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from pathlib import Path

from qnnctl.errors import UsageError
from qnnctl.sdk.components import parse_components
from qnnctl.sdk.select import PIN_FILE, pin_text
from qnnctl.sdk.versions import resolve_version


def _lines(path: Path) -> list[str]:
    """The pin's lines that say something: comments and blank lines left out."""
    return [line.split("#", 1)[0].strip() for line in pin_text(path).splitlines() if line.split("#", 1)[0].strip()]


def read_pin_components(path: Path) -> tuple[str, ...] | None:
    """The components a pin's second line names (`host,android` or `components: host,android`),
    or None when it names none; UsageError naming the file for a name that is no component."""
    lines = _lines(path)
    if len(lines) < 2:
        return None
    line = lines[1]
    key, sep, value = line.partition(":")
    if sep and key.strip().lower() == "components":
        line = value
    elif "=" in line and line.split("=", 1)[0].strip().lower() == "components":
        line = line.split("=", 1)[1]
    try:
        return parse_components(line.strip().strip("[]").replace('"', "").replace("'", ""),
                                where=f"{path}, line 2")
    except UsageError as exc:
        raise UsageError(exc.message, hint=f"fix the components in {path} (the line after the version)") from None


def write_pin(folder: Path, spec: str, pools: Iterable[tuple[str, Collection[str]]] = ()) -> tuple[Path, str]:
    """Write the full version that `spec` names (a prefix looked up in `pools`, then the known
    releases) into `folder/.qnn-version`, atomically; the components line of a pin already
    there is kept. Returns the pin's path and the version."""
    version = resolve_version(spec, pools)
    path = folder / PIN_FILE
    keep = ""
    if path.is_file():
        try:
            lines = _lines(path)
        except UsageError:
            lines = []  # a pin that cannot be read is replaced, as before
        if len(lines) >= 2:
            keep = lines[1] + "\n"
    partial = folder / f"{PIN_FILE}.{os.getpid()}.tmp"
    partial.write_text(version + "\n" + keep, encoding="utf-8")
    os.replace(partial, path)
    return path, version


