"""The bootstrap's parts, called in this process: the traceback a pipeline's hook is given, the
folders taken off sys.path, and where a folder run as a script goes on it.

test_lower.py runs the same behaviours end to end, in the pipeline's own interpreter.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from qnnctl.run import bootstrap

OWN_FILE = os.path.abspath(bootstrap.__file__)
OWN_FOLDER = os.path.dirname(os.path.realpath(bootstrap.__file__))
SITE = os.path.join(OWN_FOLDER, bootstrap.SITE_FOLDER)
CRASH = "def inner():\n    raise ValueError('boom')\n\ninner()\n"


@pytest.fixture
def pipeline_sys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter state the bootstrap hands over to a pipeline, given back after the test."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "path_importer_cache", dict(sys.path_importer_cache))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)


def _entries(tb: TracebackType | None) -> Iterator[TracebackType]:
    while tb is not None:
        yield tb
        tb = tb.tb_next


def _is_own(entry: TracebackType) -> bool:
    return os.path.abspath(entry.tb_frame.f_code.co_filename) == OWN_FILE


def _as_run_by_path(tb: TracebackType | None, pipeline_file: str) -> TracebackType | None:
    """`tb` as the interpreter hands it to sys.excepthook when bootstrap.py runs as the script:
    the bootstrap's frames, then the pipeline's. This test's frames, and any wrapper put
    around the bootstrap's functions from another file, are left out."""
    kept = [e for e in _entries(tb) if _is_own(e) or e.tb_frame.f_code.co_filename == pipeline_file]
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def _frames(tb: TracebackType | None) -> list[tuple[str, str] | str]:
    """(file, function) of each frame; the bootstrap's own as "bootstrap", whatever their names."""
    return ["bootstrap" if _is_own(e) else (e.tb_frame.f_code.co_filename, e.tb_frame.f_code.co_name)
            for e in _entries(tb)]


Call = tuple[type[BaseException], BaseException, "TracebackType | None", Any]


def _recording_hook(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Call], Any]:
    """A hook of the pipeline's, installed as sys.excepthook: each call's arguments, and the
    sys.excepthook in place while it runs."""
    calls: list[Call] = []

    def pipelines_hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        calls.append((kind, value, tb, sys.excepthook))

    monkeypatch.setattr(sys, "excepthook", pipelines_hook)
    return calls, pipelines_hook


def _uncaught(argv: list[str]) -> BaseException:
    """The error a pipeline run by `bootstrap.main(argv)` leaves uncaught."""
    try:
        bootstrap.main(argv)
    except Exception as exc:  # whatever the pipeline raised
        return exc
    pytest.fail("the pipeline's error did not reach the bootstrap's caller")


@pytest.mark.parametrize("mode", ["code", "script"])
def test_an_uncaught_error_reaches_the_pipelines_hook_from_the_pipelines_first_frame(
        pipeline_sys: None, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    if mode == "script":
        Path("crash.py").write_text(CRASH)
        target, pipeline = "crash.py", os.path.abspath("crash.py")
    else:
        target, pipeline = CRASH, "<string>"
    calls, pipelines_hook = _recording_hook(monkeypatch)
    error = _uncaught([mode, target])
    assert isinstance(error, ValueError)
    assert str(error) == "boom"

    tb = _as_run_by_path(error.__traceback__, pipeline)
    frames = _frames(tb)
    assert frames[0] == "bootstrap"
    assert frames[-2:] == [(pipeline, "<module>"), (pipeline, "inner")]
    assert set(frames[:-2]) == {"bootstrap"}
    first_of_pipeline = list(_entries(tb))[-2]

    # What the interpreter does with an uncaught error: the hook main left in place.
    hook = sys.excepthook
    hook(ValueError, error, tb)
    assert calls == [(ValueError, error, first_of_pipeline, pipelines_hook)]
    assert error.__traceback__ is first_of_pipeline  # traceback.print_exception(error) shows the same
    assert sys.excepthook is pipelines_hook


def test_an_error_raised_before_the_pipeline_ran_reaches_the_hook_with_no_frames(
        pipeline_sys: None, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, pipelines_hook = _recording_hook(monkeypatch)
    error = _uncaught(["script", "missing.py"])
    assert isinstance(error, FileNotFoundError)
    tb = _as_run_by_path(error.__traceback__, os.path.abspath("missing.py"))
    assert tb is not None
    assert set(_frames(tb)) == {"bootstrap"}

    sys.excepthook(FileNotFoundError, error, tb)
    assert calls == [(FileNotFoundError, error, None, pipelines_hook)]
    assert error.__traceback__ is None
    assert bootstrap._pipeline_frames(None) is None


def test_the_bootstrap_takes_its_folders_off_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """As `python -S bootstrap.py` starts: its own folder first, the site folder from PYTHONPATH."""
    others = object()
    monkeypatch.setattr(sys, "path", [OWN_FOLDER, "/pipeline/lib", SITE, "/elsewhere"])
    monkeypatch.setattr(sys, "path_importer_cache", {SITE: object(), "/elsewhere": others})
    assert bootstrap._leave_sys_path() is True
    assert sys.path == ["/pipeline/lib", "/elsewhere"]
    assert sys.path_importer_cache == {"/elsewhere": others}


@pytest.mark.parametrize(("before", "after"), [
    ([SITE, "/pipeline/lib"], ["/pipeline/lib"]),  # no finder for the site folder yet
    (["/pipeline/lib", OWN_FOLDER], ["/pipeline/lib", OWN_FOLDER]),  # not put there by the interpreter
    ([], []),
])
def test_the_bootstrap_leaves_a_sys_path_that_does_not_start_with_its_folder(
        monkeypatch: pytest.MonkeyPatch, before: list[str], after: list[str]) -> None:
    monkeypatch.setattr(sys, "path", list(before))  # a copy: the parameters outlive one run
    monkeypatch.setattr(sys, "path_importer_cache", {})
    assert bootstrap._leave_sys_path() is False
    assert sys.path == after
    assert sys.path_importer_cache == {}


@pytest.mark.parametrize(("version", "absolute"), [((3, 8, 18, "final", 0), False), ((3, 9, 0, "final", 0), True)])
def test_a_folder_run_as_a_script_goes_first_on_sys_path_as_that_python_puts_it(
        pipeline_sys: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        version: tuple[Any, ...], absolute: bool) -> None:
    """Before 3.9 as given, from 3.9 on made absolute."""
    Path("app").mkdir()
    Path("app", "__main__.py").write_text("import sys\nprint(sys.path[0], sys.argv)\n")
    monkeypatch.setattr(sys, "version_info", version)
    bootstrap._run_script("app", ["x"], False)
    first = os.path.join(os.getcwd(), "app") if absolute else "app"
    assert capsys.readouterr().out == f"{first} ['app', 'x']\n"
