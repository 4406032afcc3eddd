"""Environment changes as text each shell evals exactly: no code run, no words split, nothing globbed."""

from __future__ import annotations

import json

from qnnctl.errors import UsageError
from qnnctl.shell.exports import PATH_VARS, EnvValues, check_exportable

SHELLS = ("bash", "zsh", "sh", "fish", "powershell", "nu", "json", "dotenv")


def quote_posix(value: str) -> str:
    """Single-quoted for sh/bash/zsh: nothing inside is special but the quote itself."""
    return "'" + value.replace("'", "'\\''") + "'"


def quote_fish(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# PowerShell also ends a single-quoted string at the typographic single quotes; doubling
# a quote character is how each of them is written literally inside one.
_PS_QUOTES = ("'", "\u2018", "\u2019", "\u201a", "\u201b")


def quote_powershell(value: str) -> str:
    out = []
    for char in value:
        out.append(char * 2 if char in _PS_QUOTES else char)
    return "'" + "".join(out) + "'"


def quote_nu(value: str) -> str:
    """Double-quoted for nu: no interpolation without a leading `$`; backslash escapes."""
    out = []
    for char in value:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            # nu spells a code point \u{...}; JSON's \u0001 form is not nu syntax.
            out.append(f"\\u{{{ord(char):x}}}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def render(values: EnvValues, shell: str) -> str:
    """Text for `shell` that sets (or unsets) each variable to exactly its value."""
    for name, value in values.items():
        if value is not None:
            check_exportable(name, value)
    if shell == "json":
        return json.dumps(values, indent=2, ensure_ascii=False) + "\n"
    lines: list[str] = []
    for name, value in values.items():
        lines.append(_render_one(name, value, shell))
    return "".join(line + "\n" for line in lines if line)


def _render_one(name: str, value: str | None, shell: str) -> str:
    if shell in ("sh", "bash", "zsh"):
        return f"unset {name}" if value is None else f"export {name}={quote_posix(value)}"
    if shell == "fish":
        if value is None:
            return f"set -e {name}"
        if name in PATH_VARS:
            # fish keeps *PATH variables as lists and joins them with ':' on export.
            return f"set -gx {name} " + " ".join(quote_fish(e) for e in value.split(":"))
        return f"set -gx {name} {quote_fish(value)}"
    if shell == "powershell":
        if value is None:
            return f"Remove-Item -Path Env:{name} -ErrorAction SilentlyContinue"
        return f"$env:{name} = {quote_powershell(value)}"
    if shell == "nu":
        if value is None:
            return f"hide-env --ignore-errors {name}"
        if name == "PATH":
            return f"$env.{name} = [{', '.join(quote_nu(e) for e in value.split(':'))}]"
        return f"$env.{name} = {quote_nu(value)}"
    if shell == "dotenv":
        # docker --env-file and CI env files take the rest of the line literally; there is
        # no way to unset a variable there, so an unset is left out.
        return "" if value is None else f"{name}={value}"
    raise UsageError(f"unknown shell {shell!r}", hint="choose one of: " + ", ".join(SHELLS))
