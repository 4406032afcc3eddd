"""tools/mutation/changes.py: equivalent.txt's entries stay tied to the change they judged."""

from __future__ import annotations

from tools.mutation.changes import Entry, changes_in, digest, judge, parse, stamp

# A mutated file as mutmut lays it out: the original's copy, then each mutant, under its name.
MUTATED = '''\
def x_f__mutmut_orig(a: int = 1) -> int:
    b = a + 1
    return b * 2


def x_f__mutmut_1(a: int = 2) -> int:
    b = a + 1
    return b * 2


def x_f__mutmut_2(a: int = 1) -> int:
    b = a - 1
    return b * 2
'''
SPANS = {"x_f__mutmut_orig": (1, 3), "x_f__mutmut_1": (6, 8), "x_f__mutmut_2": (11, 13)}

CHANGES = {"m.x_f__mutmut_1": "-def FUNCTION(a: int = 1) -> int:\n+def FUNCTION(a: int = 2) -> int:",
           "m.x_f__mutmut_2": "-    b = a + 1\n+    b = a - 1"}


def test_a_mutants_change_is_the_lines_it_removes_and_adds_its_name_aside() -> None:
    assert changes_in(MUTATED, SPANS, "m") == CHANGES


def test_an_entry_counts_while_its_mutant_makes_the_change_it_was_judged_for() -> None:
    entry = Entry("m.x_f__mutmut_2", digest(CHANGES["m.x_f__mutmut_2"]), "why")
    assert judge([entry], CHANGES) == ({"m.x_f__mutmut_2": "why"}, [])
    # Another module's entries are not this one's business.
    assert judge([Entry("n.x_f__mutmut_2", "00000000", "why")], CHANGES) == ({}, [])


def test_a_renumbered_change_counts_under_its_new_name_and_the_entry_is_named_to_fix() -> None:
    entry = Entry("m.x_f__mutmut_1", digest(CHANGES["m.x_f__mutmut_2"]), "why")
    marked, notices = judge([entry], CHANGES)
    assert marked == {"m.x_f__mutmut_2": "why"}
    assert notices == ["m.x_f__mutmut_1: its change is now m.x_f__mutmut_2's (the function changed): rename the entry"]


def test_an_entry_whose_change_no_mutant_makes_any_more_does_not_count() -> None:
    marked, notices = judge([Entry("m.x_f__mutmut_2", "0badc0de", "why")], CHANGES)
    assert marked == {}
    assert notices == ["m.x_f__mutmut_2: no mutant makes the change judged equivalent any more (this one now "
                       "changes -    b = a + 1 | +    b = a - 1): judge it again, then --stamp it; not counted"]
    marked, notices = judge([Entry("m.x_f__mutmut_9", "0badc0de", "why")], CHANGES)
    assert marked == {}
    assert "this one now changes (no such mutant)" in notices[0]


def test_an_entry_not_stamped_does_not_count_until_stamped() -> None:
    text = ("# a comment\n\n"
            "m.x_f__mutmut_2 as _1: b - 1 for b + 1\n"
            f"m.x_f__mutmut_1 @{digest(CHANGES['m.x_f__mutmut_1'])} the default is never used\n"
            "m.x_g__mutmut_1 another function's\n")
    entries = [e for line in text.splitlines() if (e := parse(line))]
    assert entries == [Entry("m.x_f__mutmut_2", None, "as _1: b - 1 for b + 1"),
                       Entry("m.x_f__mutmut_1", digest(CHANGES["m.x_f__mutmut_1"]), "the default is never used"),
                       Entry("m.x_g__mutmut_1", None, "another function's")]
    marked, notices = judge(entries, CHANGES)
    assert marked == {"m.x_f__mutmut_1": "the default is never used"}
    assert notices == ["m.x_f__mutmut_2: not stamped with its change (--stamp), not counted"]

    stamped, count = stamp(text, CHANGES)
    assert count == 1
    assert stamped == text.replace("m.x_f__mutmut_2 as", f"m.x_f__mutmut_2 @{digest(CHANGES['m.x_f__mutmut_2'])} as")
    marked, notices = judge([e for line in stamped.splitlines() if (e := parse(line))], CHANGES)
    assert marked == {"m.x_f__mutmut_1": "the default is never used", "m.x_f__mutmut_2": "as _1: b - 1 for b + 1"}
    assert notices == []


def test_a_reason_that_starts_like_a_digest_is_a_reason() -> None:
    assert parse("m.x_f__mutmut_1 @abc is short") == Entry("m.x_f__mutmut_1", None, "@abc is short")
    assert parse("m.x_f__mutmut_1 @0123abcd") == Entry("m.x_f__mutmut_1", "0123abcd", "")


def test_two_entries_of_one_change_made_in_two_places_are_renamed_to_two_mutants_in_order() -> None:
    """The same line twice in a function (`path.unlink(missing_ok=True)` in two branches) gives
    two mutants with one change: after a renumbering, each entry takes its own, in order, and
    neither is counted twice nor lost."""
    change = "-    p.unlink(missing_ok=True)\n+    p.unlink(missing_ok=False)"
    changes = {"m.x_f__mutmut_3": "-    b = a + 1\n+    b = a - 1", "m.x_f__mutmut_12": change,
               "m.x_f__mutmut_20": change}
    # Written when they were 10 and 18; the file need not list them in order.
    entries = [Entry("m.x_f__mutmut_18", digest(change), "second"), Entry("m.x_f__mutmut_10", digest(change), "first")]
    marked, notices = judge(entries, changes)
    assert marked == {"m.x_f__mutmut_12": "first", "m.x_f__mutmut_20": "second"}
    assert notices == [
        "m.x_f__mutmut_18: its change is now m.x_f__mutmut_20's (the function changed): rename the entry",
        "m.x_f__mutmut_10: its change is now m.x_f__mutmut_12's (the function changed): rename the entry"]
    # One entry already named right: the other takes the mutant left.
    entries = [Entry("m.x_f__mutmut_10", digest(change), "first"), Entry("m.x_f__mutmut_20", digest(change), "second")]
    marked, notices = judge(entries, changes)
    assert marked == {"m.x_f__mutmut_12": "first", "m.x_f__mutmut_20": "second"}
    assert notices == [
        "m.x_f__mutmut_10: its change is now m.x_f__mutmut_12's (the function changed): rename the entry"]
    # A third entry for a change made in two places judges nothing: it is named to look at again.
    entries.append(Entry("m.x_f__mutmut_30", digest(change), "third"))
    marked, notices = judge(entries, changes)
    assert marked == {"m.x_f__mutmut_12": "first", "m.x_f__mutmut_20": "second"}
    assert notices[1:] == ["m.x_f__mutmut_30: its change is judged by the entries of m.x_f__mutmut_12, "
                           "m.x_f__mutmut_20 already: remove the entry; not counted"]
