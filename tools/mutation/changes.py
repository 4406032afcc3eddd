"""What each mutant changes, so that a judgment in equivalent.txt stays tied to what it judged.

mutmut names a function's mutants by number, in the order it makes them: a change to the
function renumbers them, and an entry "`_12` is equivalent" then names another mutant. Each
entry therefore carries a digest of the lines its mutant removes and adds (`@1a2b3c4d`); an
entry counts only while a mutant of its function still makes that change.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import re
from pathlib import Path
from typing import NamedTuple

SEPARATOR = "__mutmut_"
_DIGEST = re.compile(r"@([0-9a-f]{8})$")


def function_of(name: str) -> str:
    """The mutated function a mutant's name belongs to: `m.x_f__mutmut_3` -> `m.x_f`."""
    return name.rpartition(SEPARATOR)[0]


def mutant_changes(source: Path, module: str) -> dict[str, str]:
    """Each mutant mutmut makes of the file `source` (module `module`): its name -> the lines
    it removes and adds, with mutmut's own rules (so the names are those of a run)."""
    return changes_in(*mutated(source), module)


def mutated(source: Path) -> tuple[str, dict[str, tuple[int, int]]]:
    """The file mutmut makes of `source`, and the lines (1-based, inclusive) of each function it
    writes there: the original's copy (`..._orig`) and each mutant (`..._N`)."""
    return _mutated(str(source), source.read_text(encoding="utf-8"))


@functools.cache
def _mutated(path: str, text: str) -> tuple[str, dict[str, tuple[int, int]]]:
    # Once per text: a run asks for a module's mutants three times (equivalents, reach, report),
    # and mutmut takes some 20 seconds to make install.py's.
    from mutmut.mutation.file_mutation import mutate_file_contents

    made = mutate_file_contents(path, text)
    return made.code, {name: (span.start, span.end) for name, span in made.line_span_by_function_name.items()}


def changes_in(code: str, spans: dict[str, tuple[int, int]], module: str) -> dict[str, str]:
    """Each mutant's change in mutmut's mutated file `code`, where `spans` gives the lines
    (1-based, inclusive) of each function mutmut wrote: the original's copy (`..._orig`) and
    each mutant (`..._N`)."""
    lines = code.splitlines()

    def body(function: str) -> list[str]:
        start, end = spans[function]
        # The name is the one difference between the copies that is not the mutant's.
        return [line.replace(function, "FUNCTION") for line in lines[start - 1:end]]

    found: dict[str, str] = {}
    for function in spans:
        stem, _, number = function.rpartition(SEPARATOR)
        if number == "orig":
            continue
        diff = difflib.unified_diff(body(f"{stem}{SEPARATOR}orig"), body(function), n=0, lineterm="")
        found[f"{module}.{function}"] = "\n".join(
            line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---")))
    return found


def digest(change: str) -> str:
    return hashlib.sha256(change.encode("utf-8")).hexdigest()[:8]


class Entry(NamedTuple):
    """One line of equivalent.txt: `NAME @DIGEST reason` (the digest is missing until stamped)."""

    name: str
    digest: str | None
    reason: str


def parse(line: str) -> Entry | None:
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    name, _, rest = line.partition(" ")
    mark, _, reason = rest.strip().partition(" ")
    found = _DIGEST.fullmatch(mark)
    if found:
        return Entry(name, found.group(1), reason.strip())
    return Entry(name, None, rest.strip())


def judge(entries: list[Entry], changes: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The mutants of `changes` that entries mark equivalent (name -> reason), and a notice for
    each entry of those functions that no longer names the change it was written for.

    A line written twice in a function gives two mutants with one change: after a renumbering
    the entries of that change take its mutants in order, one each, those named right first."""
    by_change: dict[tuple[str, str], list[str]] = {}
    for name, change in changes.items():
        by_change.setdefault((function_of(name), digest(change)), []).append(name)
    functions = {function_of(name) for name in changes}
    ours = [entry for entry in entries if function_of(entry.name) in functions]

    def mutants_of(entry: Entry) -> list[str]:
        return sorted(by_change.get((function_of(entry.name), entry.digest or ""), []), key=_number)

    judged = {entry.name: entry.name for entry in ours if entry.name in mutants_of(entry)}
    taken = set(judged.values())
    for entry in sorted(ours, key=lambda e: (function_of(e.name), _number(e.name))):
        free = [name for name in mutants_of(entry) if name not in taken]
        if entry.name not in judged and free:
            judged[entry.name] = free[0]
            taken.add(free[0])
    marked: dict[str, str] = {}
    notices: list[str] = []
    for entry in ours:
        same = mutants_of(entry)
        if entry.digest is None:
            notices.append(f"{entry.name}: not stamped with its change (--stamp), not counted")
        elif entry.name in judged:
            marked[judged[entry.name]] = entry.reason
            if judged[entry.name] != entry.name:
                notices.append(f"{entry.name}: its change is now {judged[entry.name]}'s (the function changed): "
                               "rename the entry")
        elif same:
            notices.append(f"{entry.name}: its change is judged by the entries of {', '.join(same)} already: "
                           "remove the entry; not counted")
        else:
            now = changes.get(entry.name, "(no such mutant)").replace("\n", " | ")
            notices.append(f"{entry.name}: no mutant makes the change judged equivalent any more (this one now "
                           f"changes {now}): judge it again, then --stamp it; not counted")
    return marked, notices


def _number(name: str) -> int:
    """mutmut's number of a mutant: `m.x_f__mutmut_3` -> 3."""
    return int(name.rpartition(SEPARATOR)[2])


def stamp(text: str, changes: dict[str, str]) -> tuple[str, int]:
    """equivalent.txt's text with a digest added to each entry of `changes` that has none, and
    how many were stamped."""
    lines = text.splitlines(keepends=True)
    stamped = 0
    for index, line in enumerate(lines):
        entry = parse(line)
        if entry is None or entry.digest is not None or entry.name not in changes:
            continue
        ending = "\n" if line.endswith("\n") else ""
        lines[index] = f"{entry.name} @{digest(changes[entry.name])} {entry.reason}".rstrip() + ending
        stamped += 1
    return "".join(lines), stamped
