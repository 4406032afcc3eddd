"""qnnctl.records: a Record is what a typing.NamedTuple is, at run time and for mypy."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple, get_type_hints

import pytest

from qnnctl.records import Record


class Point(Record):
    """A point on a line, with a unit."""

    x: int
    y: int = 0
    unit: str = "mm"

    @property
    def norm(self) -> int:
        return abs(self.x) + abs(self.y)

    @classmethod
    def origin(cls) -> Point:
        return cls(0)

    def moved(self, dx: int) -> Point:
        return self._replace(x=self.x + dx)

    def __str__(self) -> str:
        return f"({self.x}, {self.y}) {self.unit}"


class TypingPoint(NamedTuple):
    """A point on a line, with a unit."""

    x: int
    y: int = 0
    unit: str = "mm"


def test_a_record_is_the_named_tuple_typing_would_build() -> None:
    ours, theirs = Point(3, unit="cm"), TypingPoint(3, unit="cm")
    assert isinstance(ours, tuple)
    assert tuple(ours) == tuple(theirs) == (3, 0, "cm")
    assert ours == (3, 0, "cm")
    assert Point._fields == TypingPoint._fields
    assert Point._field_defaults == TypingPoint._field_defaults
    assert get_type_hints(Point) == get_type_hints(TypingPoint) == {"x": int, "y": int, "unit": str}
    assert Point.__doc__ == TypingPoint.__doc__
    assert Point.__module__ == TypingPoint.__module__ == __name__
    assert Point.__qualname__ == "Point"
    assert repr(ours) == repr(theirs).replace("TypingPoint", "Point")
    assert ours._asdict() == theirs._asdict()
    assert Point._make([1, 2, "m"]) == (1, 2, "m")
    with pytest.raises(AttributeError):
        ours.x = 4  # type: ignore[misc]


def test_a_record_keeps_its_methods_properties_and_class_methods() -> None:
    point = Point(-2, 5)
    assert point.norm == 7
    assert Point.origin() == (0, 0, "mm")
    assert point.moved(2) == Point(0, 5)
    assert str(point) == "(-2, 5) mm"


def test_a_record_pickles_by_its_module_and_name() -> None:
    point = Point(1, 2)
    assert pickle.loads(pickle.dumps(point)) == point
    assert type(pickle.loads(pickle.dumps(point))) is Point


def test_a_record_refuses_what_typing_refuses() -> None:
    """Each of these mypy refuses too (hence the ignores): a record is checked as a NamedTuple."""
    with pytest.raises(TypeError, match="without a default follows one with a default"):
        class Bad(Record):
            a: int = 1
            b: int  # type: ignore[misc]
    with pytest.raises(AttributeError, match="cannot define _replace"):
        class Replaced(Record):
            a: int

            def _replace(self) -> None:  # type: ignore[misc]
                pass
    with pytest.raises(TypeError, match="derives from Record alone"):
        class Mixed(Record, int):  # type: ignore[misc]
            a: int


def test_record_itself_is_not_a_class_of_instances() -> None:
    with pytest.raises(TypeError, match="no class of instances"):
        isinstance(Point(1), Record)


def test_importing_records_leaves_typing_unimported() -> None:
    code = "import sys, qnnctl.records; print('typing' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "False"


def test_mypy_checks_a_records_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mypy reads a Record as a typing.NamedTuple: its fields have their types."""
    api = pytest.importorskip("mypy.api")
    source = tmp_path / "use_record.py"
    source.write_text(textwrap.dedent("""\
        from qnnctl.records import Record

        class Pair(Record):
            left: int
            right: str = ""

        Pair(1, "a").left.upper()
        Pair("one")
        reveal_type(Pair(1).right)
    """))
    monkeypatch.chdir(Path(__file__).parents[1])  # where mypy finds qnnctl's source
    stdout, _, status = api.run([str(source), "--no-incremental", "--config-file", "", "--follow-imports", "silent"])
    assert status == 1
    assert '"int" has no attribute "upper"' in stdout
    assert 'Argument 1 to "Pair" has incompatible type "str"; expected "int"' in stdout
    assert re.search(r'Revealed type is "(builtins\.)?str"', stdout)
