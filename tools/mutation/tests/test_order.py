"""tools/mutation/ordered_run.py: the order a mutation run gives each mutant's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.mutation.ordered_run import (
    EQUIVALENT_VARIABLE,
    KILLERS_VARIABLE,
    SKIPPED,
    killers_first,
    without_equivalents,
)
from tools.mutation.plugin import KILLERS_VARIABLE as RECORDED_BY_THE_PLUGIN

DURATIONS = {"t_fast": 0.1, "t_other": 0.5, "t_mid": 1.0, "t_slow": 9.0}


def _order(monkeypatch: pytest.MonkeyPatch, mutant: str) -> list[str]:
    monkeypatch.setenv("MUTANT_UNDER_TEST", mutant)
    return killers_first(list(DURATIONS), key=DURATIONS.__getitem__)


def test_a_mutants_tests_run_its_functions_killers_first_the_most_kills_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    killers = tmp_path / "killers.tsv"
    killers.write_text("qnnctl.a.x_f__mutmut_1\tt_slow\n"
                       "qnnctl.a.x_f__mutmut_2\tt_slow\n"
                       "qnnctl.a.x_f__mutmut_3\tt_mid\n"
                       "qnnctl.a.xǁCǁf__mutmut_1\tt_other\n", encoding="utf-8")
    assert KILLERS_VARIABLE == RECORDED_BY_THE_PLUGIN
    monkeypatch.setenv(KILLERS_VARIABLE, str(killers))
    assert _order(monkeypatch, "qnnctl.a.x_f__mutmut_12") == ["t_slow", "t_mid", "t_fast", "t_other"]
    # A method of the same name is another function; one with no kills keeps mutmut's order.
    assert _order(monkeypatch, "qnnctl.a.xǁCǁf__mutmut_2") == ["t_other", "t_fast", "t_mid", "t_slow"]
    assert _order(monkeypatch, "qnnctl.a.x_g__mutmut_1") == ["t_fast", "t_other", "t_mid", "t_slow"]
    # Outside a mutant's process (counting calls, the clean run): mutmut's order.
    assert _order(monkeypatch, "stats") == ["t_fast", "t_other", "t_mid", "t_slow"]
    # Read afresh each time: kills recorded meanwhile count.
    with killers.open("a", encoding="utf-8") as more:
        more.write("qnnctl.a.x_g__mutmut_1\tt_mid\n")
    assert _order(monkeypatch, "qnnctl.a.x_g__mutmut_2") == ["t_mid", "t_fast", "t_other", "t_slow"]


def test_without_a_record_of_kills_the_order_is_mutmuts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KILLERS_VARIABLE, str(tmp_path / "none-yet.tsv"))
    assert _order(monkeypatch, "qnnctl.a.x_f__mutmut_1") == ["t_fast", "t_other", "t_mid", "t_slow"]
    monkeypatch.delenv(KILLERS_VARIABLE)
    assert _order(monkeypatch, "qnnctl.a.x_f__mutmut_1") == ["t_fast", "t_other", "t_mid", "t_slow"]


def test_the_test_that_killed_the_mutant_itself_runs_before_its_functions_other_killers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    killers = tmp_path / "killers.tsv"
    killers.write_text("qnnctl.a.x_f__mutmut_1\tt_slow\n"
                       "qnnctl.a.x_f__mutmut_2\tt_slow\n"
                       "qnnctl.a.x_f__mutmut_3\tt_mid\n", encoding="utf-8")
    monkeypatch.setenv(KILLERS_VARIABLE, str(killers))
    assert _order(monkeypatch, "qnnctl.a.x_f__mutmut_3") == ["t_mid", "t_slow", "t_fast", "t_other"]
    assert _order(monkeypatch, "qnnctl.a.x_f__mutmut_2") == ["t_slow", "t_mid", "t_fast", "t_other"]
    # Mutant 1 is not mutant 13's killer though one name begins the other.
    assert _order(monkeypatch, "qnnctl.a.x_f__mutmut_13") == ["t_slow", "t_mid", "t_fast", "t_other"]


class _Meta:
    """mutmut's SourceFileMutationData, as far as the collection uses it."""

    def __init__(self, codes: dict[str, int | None]) -> None:
        self.exit_code_by_key = codes
        self.saved: list[dict[str, int | None]] = []

    def save(self) -> None:
        self.saved.append(dict(self.exit_code_by_key))


def test_mutants_marked_equivalent_are_not_tested_but_recorded_as_skipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = _Meta({"m.x_f__mutmut_1": None, "m.x_f__mutmut_2": None, "m.x_f__mutmut_3": 0})
    b = _Meta({"n.x_g__mutmut_1": None})

    def collect(*, mutant_names: list[str]) -> tuple[list[tuple[_Meta, str, int | None]], dict[str, _Meta]]:
        return [(m, k, c) for m in (a, b) for k, c in m.exit_code_by_key.items()], {"a": a, "b": b}

    listed = tmp_path / "equivalent.names"
    # _3 has a verdict (it survived before it was judged): it keeps it.
    listed.write_text("m.x_f__mutmut_2\nm.x_f__mutmut_3\n", encoding="utf-8")
    monkeypatch.setenv(EQUIVALENT_VARIABLE, str(listed))
    mutants, by_path = without_equivalents(collect)(mutant_names=[])
    assert [(k, c) for _, k, c in mutants] == [("m.x_f__mutmut_1", None), ("m.x_f__mutmut_3", 0),
                                               ("n.x_g__mutmut_1", None)]
    assert by_path == {"a": a, "b": b}
    assert a.saved == [{"m.x_f__mutmut_1": None, "m.x_f__mutmut_2": SKIPPED, "m.x_f__mutmut_3": 0}]
    assert b.saved == []
    # Without the list, mutmut's collection as it is.
    monkeypatch.delenv(EQUIVALENT_VARIABLE)
    assert len(without_equivalents(collect)(mutant_names=[])[0]) == 4
