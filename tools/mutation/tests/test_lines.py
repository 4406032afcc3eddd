"""tools/mutation/lines.py: a mutant is tested by the tests that run its change, and no others."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.mutation import lines
from tools.mutation.ordered_run import ANY, REACH_VARIABLE, killers_first, runners_of
from tools.mutation.ordered_run import LINES_RAN_VARIABLE as LINES_RAN
from tools.mutation.site import sitecustomize
from tools.mutation.tests.test_order import _order

ORIGINAL = '''\
"""A module."""


def f(a: int = 1) -> int:
    b = a + 1
    if (b > 2
            and a):
        return b
    try:
        c = int("x")
    except (ValueError,
            TypeError):
        c = 0
    return b * 2 + c


class C:
    def m(self, x: int) -> int:
        return x + 1
'''

def _copy(name: str, old: str = "", new: str = "") -> str:
    """f as mutmut copies it under `name`, with `old` made `new` in it."""
    body = ORIGINAL.split("\n\n\n")[1].replace("def f(", f"def {name}(")
    return body.replace(old, new) if old else body


# mutmut's file: the original's copy and each mutant under its name, the blank lines before
# each in its span, a method's copies inside its class.
MUTATED = "\n\n".join([
    '"""A module."""\n',
    _copy("x_f__mutmut_orig"),
    _copy("x_f__mutmut_1", "a: int = 1", "a: int = 2"),
    _copy("x_f__mutmut_2", "and a", "or a"),
    _copy("x_f__mutmut_3", "c = 0", "c = 1"),
    _copy("x_f__mutmut_4", "TypeError", "None"),
    _copy("x_f__mutmut_5", "b * 2 + c", "b * 2 - c"),
    "class C:\n\n"
    "    def xǁCǁm__mutmut_orig(self, x: int) -> int:\n        return x + 1\n\n"
    "    def xǁCǁm__mutmut_1(self, x: int) -> int:\n        return x - 1\n",
])


def _spans(text: str) -> dict[str, tuple[int, int]]:
    """Each copy's lines as mutmut gives them: from the blank lines before its `def` to its end."""
    rows = text.splitlines()
    starts = [(i, row.split("def ", 1)[1].split("(")[0])
              for i, row in enumerate(rows) if row.lstrip().startswith("def ")]
    spans: dict[str, tuple[int, int]] = {}
    for n, (index, name) in enumerate(starts):
        end = starts[n + 1][0] if n + 1 < len(starts) else len(rows)
        while not rows[end - 1].strip() or rows[end - 1].startswith("class "):
            end -= 1
        spans[name] = (index - 1, end)  # one blank line before the `def`, as mutmut's spans take
    return spans


def test_a_mutants_change_reaches_the_statement_that_holds_it() -> None:
    found = lines.reach(ORIGINAL, MUTATED, _spans(MUTATED), "m")
    assert found == {
        # A default is taken at every call: every test that calls the function can tell it.
        "m.x_f__mutmut_1": ("f", lines.ANY),
        # The second line of an `if`'s condition: the `if`'s header, not its body.
        "m.x_f__mutmut_2": ("f", "6,7"),
        # A line of an `except` clause's body: that statement; of its header: the header.
        "m.x_f__mutmut_3": ("f", "13"),
        "m.x_f__mutmut_4": ("f", "11,12"),
        "m.x_f__mutmut_5": ("f", "14"),
        "m.xǁCǁm__mutmut_1": ("C.m", "19"),
    }


def test_a_copy_that_is_not_the_originals_text_trusts_no_line_of_it() -> None:
    """An original whose function is not the one mutmut copied: any test that calls it counts.
    Lines moved by a change elsewhere are found where they are now."""
    other = ORIGINAL.replace("    b = a + 1\n", "    b = a + 2\n")
    other = other.replace('"""A module."""\n', '"""A module."""\nimport os\n')
    found = lines.reach(other, MUTATED, _spans(MUTATED), "m")
    assert {name: where for name, (_, where) in found.items()} == {
        **{f"m.x_f__mutmut_{n}": lines.ANY for n in range(1, 6)}, "m.xǁCǁm__mutmut_1": "20"}


def _write(path: Path, rows: list[tuple[str, str, int, str]]) -> Path:
    path.write_text("# abc123\n" + "".join(f"{s}\t{f}\t{n}\t{t}\n" for s, f, n, t in rows), encoding="utf-8")
    return path


def test_a_mutant_is_tested_by_the_tests_that_ran_its_change_and_those_traced_in_part(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reach = tmp_path / "reach.tsv"
    reach.write_text("qnnctl.a.x_f__mutmut_1\tf\t*\n"
                     "qnnctl.a.x_f__mutmut_2\tf\t6,7\n"
                     "qnnctl.a.xǁCǁm__mutmut_1\tC.m\t19\n", encoding="utf-8")
    ran = _write(tmp_path / "lines.tsv", [
        ("qnnctl/a.py", "f", 5, "t_fast"),  # ran f, not the `if`
        ("qnnctl/a.py", "f", 7, "t_mid"),  # ran the `if`'s second line
        ("qnnctl/a.py", "f", 6, "t_slow"),
        ("qnnctl/b.py", "f", 6, "t_other"),  # another module's f at the same line
        ("qnnctl/a.py", "C.m", 19, "t_other"),
    ])
    assert runners_of(str(reach), str(ran), "qnnctl.a.x_f__mutmut_2") == ({"t_mid", "t_slow"},
                                                                           {"t_fast", "t_mid", "t_slow"})
    assert runners_of(str(reach), str(ran), "qnnctl.a.x_f__mutmut_1") is None
    assert runners_of(str(reach), str(ran), "qnnctl.a.x_f__mutmut_9") is None  # not in reach.tsv

    monkeypatch.setenv(REACH_VARIABLE, str(reach))
    monkeypatch.setenv(LINES_RAN, str(ran))

    # t_other ran no line of f (traced in part, as mutmut says it reaches f): kept.
    assert _order(monkeypatch, "qnnctl.a.x_f__mutmut_2") == ["t_other", "t_mid", "t_slow"]
    assert _order(monkeypatch, "qnnctl.a.x_f__mutmut_1") == ["t_fast", "t_other", "t_mid", "t_slow"]
    # A method is its class's: t_other ran its line, and the others none of it.
    assert _order(monkeypatch, "qnnctl.a.xǁCǁm__mutmut_1") == ["t_fast", "t_other", "t_mid", "t_slow"]
    assert _order(monkeypatch, "stats") == ["t_fast", "t_other", "t_mid", "t_slow"]


def test_the_lines_of_a_function_nested_in_the_mutants_are_its_own(tmp_path: Path) -> None:
    """A sort key, a lambda or a comprehension (before Python 3.12) inside f runs as code of its
    own, which the tracer names `f.<locals>.key`: a test that ran its lines ran f's change."""
    reach = tmp_path / "reach.tsv"
    reach.write_text("qnnctl.a.x_f__mutmut_3\tf\t9\n"
                     "qnnctl.a.xǁCǁm__mutmut_2\tC.m\t20\n", encoding="utf-8")
    ran = _write(tmp_path / "lines.tsv", [
        ("qnnctl/a.py", "f", 8, "t_calls"),  # called f, whose key never ran
        ("qnnctl/a.py", "f.<locals>.key", 9, "t_sorts"),
        ("qnnctl/a.py", "f.<locals>.<genexpr>", 9, "t_gen"),
        ("qnnctl/a.py", "f2.<locals>.key", 9, "t_f2"),  # another function's key, at the same line
        ("qnnctl/a.py", "g.<locals>.f.<locals>.key", 9, "t_g"),  # an f nested in g is no f of the module's
        ("qnnctl/b.py", "f.<locals>.key", 9, "t_b"),
        ("qnnctl/a.py", "C.m.<locals>.<lambda>", 20, "t_lambda"),
    ])
    assert runners_of(str(reach), str(ran), "qnnctl.a.x_f__mutmut_3") == ({"t_sorts", "t_gen"},
                                                                           {"t_calls", "t_sorts", "t_gen"})
    assert runners_of(str(reach), str(ran), "qnnctl.a.xǁCǁm__mutmut_2") == ({"t_lambda"}, {"t_lambda"})


def test_no_test_running_the_change_leaves_one_test_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mutmut runs every test for an empty list: one that does not run the change survives it."""
    reach = tmp_path / "reach.tsv"
    reach.write_text("qnnctl.a.x_f__mutmut_2\tf\t6,7\n", encoding="utf-8")
    ran = _write(tmp_path / "lines.tsv", [("qnnctl/a.py", "f", 5, "t_fast"), ("qnnctl/a.py", "f", 5, "t_slow")])
    monkeypatch.setenv(REACH_VARIABLE, str(reach))
    monkeypatch.setenv(LINES_RAN, str(ran))
    monkeypatch.setenv("MUTANT_UNDER_TEST", "qnnctl.a.x_f__mutmut_2")
    assert killers_first(["t_slow", "t_fast"]) == ["t_fast"]


TRACED = '''\
import os
import threading


def in_thread():
    return 1


def forked():
    return 2


def main():
    for _ in range(3):
        threading.Thread(target=in_thread).start()
    pid = os.fork()
    if pid == 0:
        forked()
        os._exit(0)
    os.waitpid(pid, 0)
'''


def _traced_child(tmp_path: Path, record: Path, test: str) -> subprocess.CompletedProcess[str]:
    source = tmp_path / "pkg" / "traced.py"
    source.parent.mkdir(exist_ok=True)
    source.write_text(TRACED, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "pkg"), str(lines.SITE)]),
               **{lines.LINES_VARIABLE: str(record), lines.TEST_VARIABLE: test,
                  lines.SOURCES_VARIABLE: lines.sources_variable(tmp_path, ["pkg/traced.py"])})
    return subprocess.run([sys.executable, "-c", "import traced; traced.main(); print('done')"], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_child_records_each_line_it_runs_once_in_its_threads_and_forks(tmp_path: Path) -> None:
    record = tmp_path / "lines.tsv"
    done = _traced_child(tmp_path, record, "tests/test_x.py::test_y")
    assert (done.returncode, done.stdout) == (0, "done\n"), done.stderr
    rows = record.read_text(encoding="utf-8").splitlines()
    ran = [tuple(row.split("\t")[1:3]) for row in rows]
    assert set(ran) >= {("main", "14"), ("in_thread", "6"), ("forked", "10"), ("<module>", "1")}
    # Once a process: the loop's lines and those of the thread it starts three times, once.
    assert (ran.count(("main", "15")), ran.count(("in_thread", "6"))) == (1, 1)
    # The fork's child and parent both run the `if`.
    assert ran.count(("main", "17")) == 2
    assert {row.split("\t")[0] for row in rows} == {"pkg/traced.py"}
    assert {row.split("\t")[3] for row in rows} == {"tests/test_x.py::test_y"}


def test_a_child_that_cannot_write_its_lines_runs_as_it_would(tmp_path: Path) -> None:
    done = _traced_child(tmp_path, tmp_path / "no-such-folder" / "lines.tsv", "t")
    assert (done.returncode, done.stdout, done.stderr) == (0, "done\n", "")


def test_the_variables_are_the_ones_the_site_reads() -> None:
    assert (lines.LINES_VARIABLE, lines.SOURCES_VARIABLE, lines.TEST_VARIABLE) == (
        sitecustomize.LINES_VARIABLE, sitecustomize.SOURCES_VARIABLE, sitecustomize.TEST_VARIABLE)
    assert lines.ANY == ANY
    assert sitecustomize.sources_from("a.py=/x/a.py:b/c.py=/y/c.py") == {"/x/a.py": "a.py", "/y/c.py": "b/c.py"}
