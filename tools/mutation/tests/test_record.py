"""tools/mutation/record.py: a mutation run's verdicts outlive the machine that made them."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from tools.mutation import record

# mutmut.stats' table, as far as these tests need it (mutmut is not installed in CI).
STATUS_BY_EXIT_CODE = {1: "killed", 3: "killed", 0: "survived", 2: "check was interrupted by user", None: "not checked",
                       33: "no tests", 34: "skipped", 36: "timeout", -24: "timeout"}
SOURCES = ("qnnctl/a.py", "qnnctl/b.py")
MUTMUT = "3.8.1"


def _hashes(text: str) -> dict[str, str]:
    """Stands in for mutmut's compute_function_hashes: each function's mangled name (as in its
    mutants' names), and a hash of its text."""
    blocks = re.split(r"^(?=def )", text, flags=re.MULTILINE)
    return {"x_" + block.split("(")[0].removeprefix("def "): hashlib.sha256(block.strip().encode()).hexdigest()[:12]
            for block in blocks if block.startswith("def ")}


def _run_folder(tmp_path: Path, codes: dict[str, dict[str, int | None]], killers: str = "") -> Path:
    """mutants/MODULE as a run leaves it: the exported sources, mutmut's meta files, killers.tsv."""
    work = tmp_path / "work"
    for source in SOURCES:
        (work / source).parent.mkdir(parents=True, exist_ok=True)
        (work / source).write_text(f"def f(x):\n    return x + {len(source)}\n", encoding="utf-8")
    for source, by_key in codes.items():
        meta = work / "mutants" / f"{source}.meta"
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps({"exit_code_by_key": by_key}), encoding="utf-8")
    (work / "COMMIT").write_text("abc123\n", encoding="utf-8")
    (work / "pyproject.toml").write_text("[tool.mutmut]\ntimeout_multiplier = 3.0\n", encoding="utf-8")
    if killers:
        (work / "killers.tsv").write_text(killers, encoding="utf-8")
    return work


def _fresh_folder(tmp_path: Path, work: Path) -> Path:
    """The same export on another machine: the sources, nothing of mutmut's."""
    fresh = tmp_path / "fresh"
    for name in (*SOURCES, "pyproject.toml"):
        (fresh / name).parent.mkdir(parents=True, exist_ok=True)
        (fresh / name).write_bytes((work / name).read_bytes())
    return fresh


CODES: dict[str, dict[str, int | None]] = {
    "qnnctl/a.py": {"qnnctl.a.x_f__mutmut_1": 1, "qnnctl.a.x_f__mutmut_2": 0, "qnnctl.a.x_f__mutmut_3": None,
                    "qnnctl.a.x_f__mutmut_4": 2, "qnnctl.a.x_f__mutmut_5": -24, "qnnctl.a.x_f__mutmut_6": None},
    "qnnctl/b.py": {"qnnctl.b.x_f__mutmut_1": 3, "qnnctl.b.x_f__mutmut_2": 34},
}
# killers.tsv appends: a mutant killed again (a --retest) names its last killer.
KILLERS = ("qnnctl.a.x_f__mutmut_1\ttests/test_a.py::test_old\n"
           "qnnctl.b.x_f__mutmut_1\ttests/test_b.py::test_b[x\ty]\n"
           "qnnctl.a.x_f__mutmut_1\ttests/test_a.py::test_new\n"
           "qnnctl.a.x_f__mutmut_2\ttests/test_a.py::test_flaky\n"
           "qnnctl.a.x_f__mutmut_6\ttests/test_a.py::test_six\n")


def test_a_run_is_recorded_with_each_verdict_and_the_test_that_killed_it(tmp_path: Path) -> None:
    work = _run_folder(tmp_path, CODES, KILLERS)
    found = record.collect(work, SOURCES, STATUS_BY_EXIT_CODE, MUTMUT)
    assert found.commit == "abc123"
    assert found.inputs == {**{s: record.file_digest(work / s) for s in SOURCES},
                            "pyproject.toml": record.settings_digest(work / "pyproject.toml"), "mutmut": MUTMUT}
    assert found.verdicts == {
        "qnnctl.a.x_f__mutmut_1": record.Verdict("killed", "tests/test_a.py::test_new"),
        # A survivor keeps no killer, whatever killers.tsv says of an earlier run.
        "qnnctl.a.x_f__mutmut_2": record.Verdict("survived", None),
        "qnnctl.a.x_f__mutmut_3": record.Verdict("not checked", None),
        # Not checked again yet (its module changed): the killer it had still orders its check.
        "qnnctl.a.x_f__mutmut_6": record.Verdict("not checked", "tests/test_a.py::test_six"),
        # An interrupted check is no verdict.
        "qnnctl.a.x_f__mutmut_4": record.Verdict("not checked", None),
        "qnnctl.a.x_f__mutmut_5": record.Verdict("timeout", None),
        "qnnctl.b.x_f__mutmut_1": record.Verdict("killed", "tests/test_b.py::test_b[x\ty]"),
        "qnnctl.b.x_f__mutmut_2": record.Verdict("skipped", None),
    }
    text = record.render(found)
    assert record.parse(text) == found._replace(verdicts={
        **found.verdicts,
        # A tab in a test's id is not kept: the record's fields are split on tabs.
        "qnnctl.b.x_f__mutmut_1": record.Verdict("killed", "tests/test_b.py::test_b[x y]")})
    assert text.splitlines()[1:3] == ["commit\tabc123", "input\tmutmut\t3.8.1"]
    assert text.splitlines()[3] == f"input\tpyproject.toml\t{found.inputs['pyproject.toml']}"


def test_a_damaged_record_is_refused_naming_its_line() -> None:
    with pytest.raises(ValueError, match=r"line 3 of a mutation record is not one: 'm.x_f__mutmut_1\\tdead\\t-'"):
        record.parse("# header\ncommit\tabc\nm.x_f__mutmut_1\tdead\t-\n")


def test_on_another_machine_the_same_sources_get_the_verdicts_back(tmp_path: Path) -> None:
    work = _run_folder(tmp_path, CODES, KILLERS)
    saved = record.parse(record.render(record.collect(work, SOURCES, STATUS_BY_EXIT_CODE, MUTMUT)))
    fresh = _fresh_folder(tmp_path, work)
    assert record.restore(saved, fresh, SOURCES, MUTMUT, _hashes) == (5, 3)
    meta = json.loads((fresh / "mutants" / "qnnctl/a.py.meta").read_text(encoding="utf-8"))
    assert meta["exit_code_by_key"] == {"qnnctl.a.x_f__mutmut_1": 1, "qnnctl.a.x_f__mutmut_2": 0,
                                        "qnnctl.a.x_f__mutmut_3": None, "qnnctl.a.x_f__mutmut_4": None,
                                        "qnnctl.a.x_f__mutmut_5": 36, "qnnctl.a.x_f__mutmut_6": None}
    # mutmut keeps a verdict while the function's hash is the one its meta file holds.
    assert meta["hash_by_function_name"] == _hashes((fresh / "qnnctl/a.py").read_text(encoding="utf-8"))
    assert set(meta) == {"exit_code_by_key", "hash_by_function_name", "durations_by_key",
                         "estimated_durations_by_key", "type_check_error_by_key"}
    assert json.loads((fresh / "mutants" / "qnnctl/b.py.meta").read_text(encoding="utf-8"))["exit_code_by_key"] == {
        "qnnctl.b.x_f__mutmut_1": 1, "qnnctl.b.x_f__mutmut_2": 34}
    assert record.killers_of(fresh / "killers.tsv") == {"qnnctl.a.x_f__mutmut_1": "tests/test_a.py::test_new",
                                                        "qnnctl.a.x_f__mutmut_6": "tests/test_a.py::test_six",
                                                        "qnnctl.b.x_f__mutmut_1": "tests/test_b.py::test_b[x y]"}


def test_a_change_outside_the_settings_of_tests_keeps_the_verdicts(tmp_path: Path) -> None:
    work = _run_folder(tmp_path, CODES, KILLERS)
    saved = record.collect(work, SOURCES, STATUS_BY_EXIT_CODE, MUTMUT)
    fresh = _fresh_folder(tmp_path, work)
    (fresh / "pyproject.toml").write_text('[project]\ndependencies = ["urllib3>=2.1"]\n\n'
                                          "[tool.mutmut]\ntimeout_multiplier = 3.0\n", encoding="utf-8")
    assert record.restore(saved, fresh, SOURCES, MUTMUT, _hashes) == (5, 3)


def test_a_record_with_the_digest_of_the_whole_settings_file_still_gives_its_verdicts_back(tmp_path: Path) -> None:
    work = _run_folder(tmp_path, CODES, KILLERS)
    saved = record.collect(work, SOURCES, STATUS_BY_EXIT_CODE, MUTMUT)
    saved.inputs["pyproject.toml"] = record.file_digest(work / "pyproject.toml")
    fresh = _fresh_folder(tmp_path, work)
    assert record.restore(saved, fresh, SOURCES, MUTMUT, _hashes) == (5, 3)


@pytest.mark.parametrize("change", ["settings", "pytest", "mutmut"])
def test_other_settings_get_only_the_killers_back(tmp_path: Path, change: str) -> None:
    work = _run_folder(tmp_path, CODES, KILLERS)
    saved = record.collect(work, SOURCES, STATUS_BY_EXIT_CODE, MUTMUT)
    fresh = _fresh_folder(tmp_path, work)
    mutmut = MUTMUT
    if change == "settings":  # another list of tests, another timeout
        (fresh / "pyproject.toml").write_text("[tool.mutmut]\ntimeout_multiplier = 15.0\n", encoding="utf-8")
    elif change == "pytest":  # another option of pytest's
        (fresh / "pyproject.toml").write_text('[tool.mutmut]\ntimeout_multiplier = 3.0\n\n'
                                              '[tool.pytest.ini_options]\naddopts = "-x"\n', encoding="utf-8")
    else:  # another release may number the mutants otherwise
        mutmut = "3.9.0"
    assert record.restore(saved, fresh, SOURCES, mutmut, _hashes) == (0, 3)
    assert not (fresh / "mutants").exists()
    assert set(record.killers_of(fresh / "killers.tsv")) == {"qnnctl.a.x_f__mutmut_1", "qnnctl.a.x_f__mutmut_6",
                                                             "qnnctl.b.x_f__mutmut_1"}


def test_a_changed_function_is_checked_again_and_the_others_keep_their_verdicts(tmp_path: Path) -> None:
    """mutmut's own rule, as if its mutants/ had been kept: a function whose hash changed loses
    its verdicts (not its killers), wherever else the module changed."""
    work = _run_folder(tmp_path, {}, "qnnctl.a.x_g__mutmut_1\ttests/test_a.py::test_g\n")
    source = work / "qnnctl/a.py"
    source.write_text("def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x - 1\n", encoding="utf-8")
    meta = work / "mutants" / "qnnctl/a.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({
        "exit_code_by_key": {"qnnctl.a.x_f__mutmut_1": 1, "qnnctl.a.x_f__mutmut_2": 0,
                             "qnnctl.a.x_g__mutmut_1": 1, "qnnctl.a.x_g__mutmut_2": 36},
        "hash_by_function_name": _hashes(source.read_text(encoding="utf-8"))}), encoding="utf-8")
    saved = record.parse(record.render(record.collect(work, SOURCES, STATUS_BY_EXIT_CODE, MUTMUT)))
    assert saved.functions == {"qnnctl/a.py": _hashes(source.read_text(encoding="utf-8"))}
    fresh = _fresh_folder(tmp_path, work)
    changed = "# a comment of the module\ndef f(x):\n    return x + 1\n\n\ndef g(x):\n    return x - 2\n"
    (fresh / "qnnctl/a.py").write_text(changed, encoding="utf-8")
    assert record.restore(saved, fresh, SOURCES, MUTMUT, _hashes) == (2, 1)
    restored = json.loads((fresh / "mutants" / "qnnctl/a.py.meta").read_text(encoding="utf-8"))
    assert restored["exit_code_by_key"] == {"qnnctl.a.x_f__mutmut_1": 1, "qnnctl.a.x_f__mutmut_2": 0,
                                            "qnnctl.a.x_g__mutmut_1": None, "qnnctl.a.x_g__mutmut_2": None}
    assert restored["hash_by_function_name"] == _hashes(changed)
    assert record.killers_of(fresh / "killers.tsv") == {"qnnctl.a.x_g__mutmut_1": "tests/test_a.py::test_g"}


def test_an_older_record_without_hashes_vouches_only_for_a_whole_unchanged_file(tmp_path: Path) -> None:
    work = _run_folder(tmp_path, CODES, KILLERS)
    saved = record.collect(work, SOURCES, STATUS_BY_EXIT_CODE, MUTMUT)
    assert saved.functions == {}
    fresh = _fresh_folder(tmp_path, work)
    with (fresh / "qnnctl/b.py").open("a", encoding="utf-8") as changed:
        changed.write("\n")
    assert record.restore(saved, fresh, SOURCES, MUTMUT, _hashes) == (3, 3)
    assert record.exit_codes(record.metas(fresh, SOURCES)) == {
        "qnnctl.a.x_f__mutmut_1": 1, "qnnctl.a.x_f__mutmut_2": 0, "qnnctl.a.x_f__mutmut_3": None,
        "qnnctl.a.x_f__mutmut_4": None, "qnnctl.a.x_f__mutmut_5": 36, "qnnctl.a.x_f__mutmut_6": None,
        "qnnctl.b.x_f__mutmut_1": None, "qnnctl.b.x_f__mutmut_2": None}


def test_a_run_folder_of_this_machine_keeps_its_own_verdicts_and_killers(tmp_path: Path) -> None:
    work = _run_folder(tmp_path, CODES, KILLERS)
    saved = record.collect(work, SOURCES, STATUS_BY_EXIT_CODE, MUTMUT)
    newer: dict[str, dict[str, int | None]] = {
        "qnnctl/a.py": {"qnnctl.a.x_f__mutmut_1": 1, "qnnctl.a.x_f__mutmut_2": 1}}
    _run_folder(tmp_path, newer, "qnnctl.a.x_f__mutmut_2\ttests/test_a.py::test_added\n")
    (work / "mutants" / "qnnctl/b.py.meta").unlink()
    meta_before = (work / "mutants" / "qnnctl/a.py.meta").read_text(encoding="utf-8")
    # Its b.py has no verdicts yet: the record's come back for that file alone.
    assert record.restore(saved, work, SOURCES, MUTMUT, _hashes) == (2, 0)
    assert (work / "mutants" / "qnnctl/a.py.meta").read_text(encoding="utf-8") == meta_before
    assert record.killers_of(work / "killers.tsv") == {"qnnctl.a.x_f__mutmut_2": "tests/test_a.py::test_added"}
