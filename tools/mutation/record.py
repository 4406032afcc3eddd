"""The verdicts of a module's last mutation run, kept in the repository (tools/mutation/record/).

mutmut keeps its verdicts in `mutants/` beside the checkout, which a new machine does not have:
without a record, each run there starts again from the first mutant and spends its time on
mutants checked before. The record holds, for each mutant, mutmut's verdict and the test that
killed it:

- verdicts come back by mutmut's own rule, as if its `mutants/` had been kept: while the
  mutant's function is unchanged (its hash, which the record keeps, is the one mutmut computes
  now), under the same mutmut settings (the narrowed pyproject.toml's `[tool.mutmut]` and
  `[tool.pytest]`: the test files, the timeout, pytest's options; not the rest of the file,
  whose dependencies' floors change no verdict) and the same mutmut release (which numbers the
  mutants). A fix in one function then costs a check of that function's mutants alone. A
  record without the hashes (an older one) gives verdicts back only while the whole source
  file is byte for byte the same. Changed tests do not drop them, as in mutmut itself
  (`--retest` tests the survivors again);
- killers come back always: they only order each mutant's tests (ordered_run.py), so a changed
  module is checked again at about one test a killed mutant.

A text file, one mutant a line, so that its diff shows what a run changed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from tools.mutation.changes import function_of

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# mutmut's exit codes for the verdicts a record keeps, by the words it prints (mutmut.stats);
# "not checked" (and an interrupted check) is kept as not checked.
CODE_BY_STATUS: dict[str, int | None] = {
    "killed": 1,
    "survived": 0,
    "no tests": 33,
    "skipped": 34,
    "suspicious": 35,
    "timeout": 36,
    "caught by type check": 37,
    "segfault": -11,
    "not checked": None,
}
HEADER = "# mutmut's verdicts of the module's last run, and the test that killed each mutant (tools/mutation/README.md)"


class Verdict(NamedTuple):
    status: str
    killer: str | None


class Record(NamedTuple):
    commit: str
    inputs: dict[str, str]  # each source file and the settings -> its sha256; "mutmut" -> its release
    verdicts: dict[str, Verdict]
    functions: dict[str, dict[str, str]]  # each source file -> mutmut's hash of each function


SETTINGS = "pyproject.toml"  # in the run folder: [tool.mutmut] narrowed to the module


def inputs_of(work: Path, sources: tuple[str, ...], mutmut_version: str) -> dict[str, str]:
    """What a run's verdicts depend on besides the tests: the module's sources as exported in
    `work`, the settings mutmut ran with there, and mutmut's release."""
    found = {name: file_digest(work / name) for name in sources}
    found[SETTINGS] = settings_digest(work / SETTINGS)
    found["mutmut"] = mutmut_version
    return found


def settings_digest(path: Path) -> str:
    """The sha256 of the settings a verdict depends on: the `[tool.mutmut]` and `[tool.pytest]`
    tables of the pyproject.toml at `path`, as canonical JSON."""
    tools = tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {})
    kept = {name: tools[name] for name in ("mutmut", "pytest") if name in tools}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def render(record: Record) -> str:
    lines = [HEADER, f"commit\t{record.commit}"]
    lines += [f"input\t{name}\t{digest}" for name, digest in sorted(record.inputs.items())]
    lines += [f"function\t{source}\t{function}\t{hashed}" for source, hashes in sorted(record.functions.items())
              for function, hashed in sorted(hashes.items())]
    # A killer only orders tests: one whose id holds a tab (pytest escapes the other controls)
    # is kept with a blank for it, which matches no test and so orders nothing.
    lines += [f"{name}\t{v.status}\t{(v.killer or '-').replace(chr(9), ' ')}"
              for name, v in sorted(record.verdicts.items())]
    return "\n".join(lines) + "\n"


def parse(text: str) -> Record:
    commit = ""
    inputs: dict[str, str] = {}
    verdicts: dict[str, Verdict] = {}
    functions: dict[str, dict[str, str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        fields = line.split("\t")
        if fields[0] == "commit" and len(fields) == 2:
            commit = fields[1]
        elif fields[0] == "input" and len(fields) == 3:
            inputs[fields[1]] = fields[2]
        elif fields[0] == "function" and len(fields) == 4:
            functions.setdefault(fields[1], {})[fields[2]] = fields[3]
        elif len(fields) == 3 and fields[1] in CODE_BY_STATUS:
            verdicts[fields[0]] = Verdict(fields[1], None if fields[2] == "-" else fields[2])
        else:
            raise ValueError(f"line {number} of a mutation record is not one: {line!r}")
    return Record(commit, inputs, verdicts, functions)


def killers_of(path: Path) -> dict[str, str]:
    """The last test recorded as killing each mutant in a killers.tsv (plugin.py appends to it)."""
    found: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            mutant, _, test = line.partition("\t")
            if test:
                found[mutant] = test
    return found


def metas(work: Path, sources: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The .meta file mutmut keeps in `work` (mutants/MODULE) beside each source's mutants, of
    the sources that have one."""
    found: dict[str, dict[str, Any]] = {}
    for source in sources:
        meta = work / "mutants" / f"{source}.meta"
        if meta.is_file():
            found[source] = json.loads(meta.read_text(encoding="utf-8"))
    return found


def exit_codes(found: Mapping[str, dict[str, Any]]) -> dict[str, int | None]:
    """Each mutant's exit code so far (None: not tested), from the meta files `found` (metas)."""
    return {key: code for meta in found.values() for key, code in meta["exit_code_by_key"].items()}


def collect(work: Path, sources: tuple[str, ...], status_by_exit_code: Mapping[int | None, str],
            mutmut_version: str) -> Record:
    """The record of the run in `work` (mutants/MODULE): its verdicts (mutmut's exit codes read
    with `status_by_exit_code`, mutmut.stats') and killers, and its inputs (inputs_of)."""
    killers = killers_of(work / "killers.tsv")
    found = metas(work, sources)
    verdicts: dict[str, Verdict] = {}
    for name, code in exit_codes(found).items():
        status = status_by_exit_code[code]
        if status not in CODE_BY_STATUS:  # interrupted: not checked
            status = "not checked"
        # A mutant not checked again yet (its module changed) keeps the killer it had: it
        # orders that check. A survivor's killer is of an earlier run, and orders nothing.
        kept = status not in {"survived", "skipped", "no tests"}
        verdicts[name] = Verdict(status, killers.get(name) if kept else None)
    commit = (work / "COMMIT").read_text(encoding="utf-8").strip() if (work / "COMMIT").is_file() else ""
    functions = {source: dict(meta["hash_by_function_name"]) for source, meta in found.items()
                 if meta.get("hash_by_function_name")}
    return Record(commit, inputs_of(work, sources, mutmut_version), verdicts, functions)


def restore(record: Record, work: Path, sources: tuple[str, ...], mutmut_version: str,
            function_hashes: Callable[[str], dict[str, str]]) -> tuple[int, int]:
    """Seed the run folder `work` from `record`: the killers, when it has none; the verdicts of
    each source without any yet, those of its functions unchanged since the record, under the
    record's settings and mutmut release. `function_hashes` gives mutmut's hash of each function
    of a source text (its compute_function_hashes). Returns how many verdicts and killers were
    restored."""
    killers = work / "killers.tsv"
    recorded_killers = {name: v.killer for name, v in record.verdicts.items() if v.killer}
    seeded = 0
    if not killers.exists() and recorded_killers:
        killers.write_text("".join(f"{name}\t{test}\n" for name, test in sorted(recorded_killers.items())),
                           encoding="utf-8")
        seeded = len(recorded_killers)
    restored = 0
    now = inputs_of(work, sources, mutmut_version)
    # A record written before 2026-12-06 holds the digest of the whole file.
    settings = {now[SETTINGS], file_digest(work / SETTINGS)}
    same_settings = record.inputs.get(SETTINGS) in settings and record.inputs.get("mutmut") == now["mutmut"]
    for source in sources:
        meta = work / "mutants" / f"{source}.meta"
        prefix = source.removesuffix(".py").replace("/", ".") + "."
        codes = {name: CODE_BY_STATUS[v.status] for name, v in record.verdicts.items() if name.startswith(prefix)}
        if not same_settings or meta.exists() or not codes:
            continue
        hashes = function_hashes((work / source).read_text(encoding="utf-8"))
        recorded = record.functions.get(source)
        if recorded is None:  # an older record: only a whole unchanged file vouches for its functions
            recorded = hashes if record.inputs.get(source) == now[source] else {}
        for name in codes:
            function = function_of(name).removeprefix(prefix)
            if function not in hashes or recorded.get(function) != hashes[function]:
                codes[name] = None  # changed (or gone) since the record: to be checked again
        # mutmut keeps a verdict while its function's hash is the one in the meta file.
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps({"exit_code_by_key": codes, "hash_by_function_name": hashes,
                                    "durations_by_key": {}, "estimated_durations_by_key": {},
                                    "type_check_error_by_key": {}}, indent=4), encoding="utf-8")
        restored += sum(code is not None for code in codes.values())
    return restored, seeded
