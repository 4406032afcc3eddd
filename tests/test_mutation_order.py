"""tests/mutation/ordered_run.py: the order a mutation run gives each mutant's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mutation.ordered_run import KILLERS_VARIABLE, killers_first
from tests.mutation.plugin import KILLERS_VARIABLE as RECORDED_BY_THE_PLUGIN

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
