"""python -m tools.mutation MODULE: mutmut on one module with its own tests (tools/mutation/README.md)."""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

from tools.mutation import TARGETS, Target, lines, record
from tools.mutation.changes import judge, mutant_changes, mutated, parse, stamp
from tools.mutation.ordered_run import EQUIVALENT_VARIABLE, LINES_RAN_VARIABLE, REACH_VARIABLE
from tools.mutation.plugin import HOOK_VARIABLE, KILLERS_VARIABLE

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "mutants"
EQUIVALENT = Path(__file__).with_name("equivalent.txt")
RECORDS = Path(__file__).with_name("record")
# mutmut's verdicts, grouped as they count for the score: a mutant that made the tests hang
# or fail is caught; one with no test reaching it is as bad as a survivor. "skipped" is a
# mutant marked equivalent that was not tested (ordered_run.py): it counts as left, and so as
# equivalent while it is marked.
CAUGHT = {"killed", "timeout", "caught by type check"}
LEFT = {"survived", "no tests", "suspicious", "segfault", "skipped"}


def pyproject_for(target: Target) -> str:
    """The repository's pyproject.toml with [tool.mutmut] narrowed to one module and its tests."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    settings = dict(tomllib.loads(text)["tool"]["mutmut"])
    settings["only_mutate"] = list(target.sources)
    settings["pytest_add_cli_args_test_selection"] = list(target.tests)
    kept: list[str] = []
    skipping = False
    for line in text.splitlines():
        if line.startswith("["):
            skipping = line.strip() == "[tool.mutmut]"
        if not skipping:
            kept.append(line)
    # JSON's strings, lists, booleans and numbers are TOML's too.
    return "\n".join([*kept, "[tool.mutmut]", *(f"{k} = {json.dumps(v)}" for k, v in settings.items())]) + "\n"


# What a run exports of the last commit: the code, its tests, and this tool, whose plugins the
# tests load and whose ordered_run.py runs mutmut (mutmut copies tools/ beside its mutants:
# `also_copy` in pyproject.toml).
EXPORTED = ("qnnctl", "tests", "tools/__init__.py", "tools/mutation")


def prepare(name: str, target: Target) -> Path:
    """mutants/NAME: EXPORTED as the last commit has them, and the narrowed pyproject.

    The commit, not the working tree: what is scored is code that others can check out again,
    without changes still in progress in it. mutmut keeps each mutant's verdict while the
    function it belongs to is unchanged, so exporting afresh for each run costs nothing.
    """
    work = WORK / name
    work.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    for part in {path.partition("/")[0] for path in EXPORTED}:
        if (work / part).is_symlink() or (work / part).is_file():
            (work / part).unlink()
        elif (work / part).exists():
            shutil.rmtree(work / part)
    archive = subprocess.run(["git", "archive", "--format=tar", commit, *EXPORTED], cwd=REPO,
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(work, filter="data")
    (work / "COMMIT").write_text(commit + "\n", encoding="utf-8")
    (work / "pyproject.toml").write_text(pyproject_for(target), encoding="utf-8")
    forget_reach(work, commit)
    recorded = RECORDS / f"{name}.tsv"
    if recorded.is_file():
        from mutmut import __version__
        from mutmut.mutation.file_mutation import compute_function_hashes

        verdicts, killers = record.restore(record.parse(recorded.read_text(encoding="utf-8")), work, target.sources,
                                           __version__, compute_function_hashes)
        if verdicts or killers:
            print(f"from {recorded.relative_to(REPO)}: {verdicts} verdicts, {killers} killers", file=sys.stderr)
    return work


# The exported files that change nothing of which tests reach which function: the harness's own
# bookkeeping (runs commit their records and equivalents), its tests, and the docs.
NOT_REACH = ("tests/README.md", "tools/__init__.py", "tools/mutation/README.md", "tools/mutation/tests",
             "tools/mutation/__main__.py", "tools/mutation/changes.py", "tools/mutation/ordered_run.py",
             "tools/mutation/record.py", "tools/mutation/record", "tools/mutation/equivalent.txt")


def same_reach(known: str | None, commit: str) -> bool:
    """Whether EXPORTED is the same at both commits, but for files that change no reach."""
    return known is not None and (known == commit or subprocess.run(
        ["git", "diff", "--quiet", known, commit, "--", *EXPORTED, *(f":!{path}" for path in NOT_REACH)],
        cwd=REPO).returncode == 0)


def forget_reach(work: Path, commit: str) -> None:
    """Make mutmut learn afresh which tests reach which function when the export changed since
    it learnt it.

    mutmut keeps what it learnt and only adds what tests new to it reach: a function written
    since (or one an old test reaches now) would be tested by the new tests alone, and its
    mutants would survive tests that kill them. The verdicts are kept; only the reach goes.
    """
    stats = work / "mutants" / "mutmut-stats.json"
    learnt = work / "STATS_COMMIT"
    known = learnt.read_text(encoding="utf-8").strip() if learnt.is_file() else None
    if stats.is_file() and known != commit:
        if not same_reach(known, commit):
            data = json.loads(stats.read_text(encoding="utf-8"))
            # With no test known, mutmut takes every test for new and follows each one.
            data["tests_by_mangled_function_name"] = {}
            data["duration_by_test"] = {}
            stats.write_text(json.dumps(data), encoding="utf-8")
            print("the code or tests changed since the last run: mutmut learns again which tests reach "
                  "which function", file=sys.stderr)
    learnt.write_text(commit + "\n", encoding="utf-8")


LINES = "lines.tsv"  # in mutants/MODULE: the lines each test ran, first a line `# COMMIT`
REACH = "reach.tsv"  # in mutants/MODULE: each mutant's function and the lines where its change is


def collect_lines(work: Path, target: Target) -> int:
    """Run the module's tests once on the original code of the export, recording the lines of
    its sources each one runs (lines.py) in `work`/lines.tsv."""
    commit = (work / "COMMIT").read_text(encoding="utf-8").strip()
    partial = work / f"{LINES}.partial"
    partial.write_text(f"# {commit}\n", encoding="utf-8")
    partial.chmod(0o666)  # for the children some tests run as another user (nobody)
    environ = dict(os.environ, **{lines.LINES_VARIABLE: str(partial),
                                  lines.SOURCES_VARIABLE: lines.sources_variable(work, target.sources)})
    environ.pop("MUTANT_UNDER_TEST", None)
    print(f"recording the lines of {' '.join(target.sources)} each test runs", file=sys.stderr)
    code = subprocess.run(["nice", "-n", "10", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "tools.mutation.lines", *target.tests], cwd=work, env=environ,
                          preexec_fn=_default_sigint).returncode
    if code not in (0, 1):  # 1: some tests failed, and what they ran is recorded all the same
        print(f"the tests did not run to their end (pytest's exit code {code}): no lines kept", file=sys.stderr)
        return code
    partial.replace(work / LINES)
    return 0


def lines_in_use(work: Path, commit: str, quiet: bool = False) -> bool:
    """Whether `work`/lines.tsv was recorded for code that reaches as `commit`'s does."""
    path = work / LINES
    if not path.is_file():
        return False
    with path.open(encoding="utf-8") as recorded:
        known = recorded.readline().removeprefix("# ").strip()
    if same_reach(known, commit):
        return True
    if not quiet:
        print(f"{path.relative_to(REPO)} was recorded at {known[:12]}, and the code or tests changed since: every "
              f"test that reaches a function tests its mutants (--lines records them again)", file=sys.stderr)
    return False


def write_reach(work: Path, target: Target) -> None:
    """`work`/reach.tsv: each mutant's function and the lines of the original where its change is."""
    rows: list[str] = []
    for source in target.sources:
        module = source.removesuffix(".py").replace("/", ".")
        found = lines.reach((work / source).read_text(encoding="utf-8"), *mutated(work / source), module)
        rows.extend(f"{name}\t{function}\t{where}\n" for name, (function, where) in found.items())
    (work / REACH).write_text("".join(rows), encoding="utf-8")


def statuses(work: Path, target: Target) -> dict[str, str]:
    """Each mutant's verdict so far (mutmut's words), from the records mutmut keeps."""
    from mutmut.stats import status_by_exit_code

    codes = record.exit_codes(record.metas(work, target.sources))
    return {key: status_by_exit_code[code] for key, code in codes.items()}


def module_changes(work: Path, target: Target) -> dict[str, str]:
    """What each mutant of the target's sources, as exported in `work`, changes (changes.py)."""
    found: dict[str, str] = {}
    for source in target.sources:
        found.update(mutant_changes(work / source, source.removesuffix(".py").replace("/", ".")))
    return found


def equivalents(work: Path, target: Target, quiet: bool = False) -> dict[str, str]:
    """The target's mutants that equivalent.txt marks (no test can tell them from the original
    code), with the reason; on stderr, each entry that no longer names the change it judged."""
    entries = [e for line in EQUIVALENT.read_text(encoding="utf-8").splitlines() if (e := parse(line))]
    marked, notices = judge(entries, module_changes(work, target))
    if not quiet:
        for notice in notices:
            print(f"equivalent.txt: {notice}", file=sys.stderr)
    return marked


def stamp_equivalents(work: Path, target: Target) -> int:
    """Give each entry of the target without a digest the digest of its mutant's change, as the
    last run made it (what `mutmut show` there shows)."""
    text, stamped = stamp(EQUIVALENT.read_text(encoding="utf-8"), module_changes(work, target))
    EQUIVALENT.write_text(text, encoding="utf-8")
    print(f"stamped {stamped} entries of equivalent.txt", file=sys.stderr)
    return 0


def _default_sigint() -> None:
    # A command started in the background (`... &`) inherits SIGINT ignored, and Python then
    # installs no KeyboardInterrupt for it: mutmut would not stop when asked.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# In an interpreter that ignores PYTHONPATH (python -I, -E: how `qnnctl lower` starts the
# bootstrap), site still reads the .pth files of site-packages: this one runs the children's
# sitecustomize there (tools/mutation/site), which PYTHONPATH brings to every other child.
HOOK_PTH = "qnnctl-mutation-hook.pth"
HOOK_LINE = (f"import os, sys; h = os.environ.get({HOOK_VARIABLE!r}); "
             "sys.flags.ignore_environment and h and exec(compile(open(h).read(), h, 'exec'), "
             "{'__name__': 'qnnctl_mutation_hook', '__file__': h})\n")


def hook_path() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"]) / HOOK_PTH


def run_mutmut(work: Path, args: list[str], minutes: float, by_line: bool) -> int:
    """mutmut in `work` (see run_mutmut_now), with the hook in site-packages while it runs."""
    hook = hook_path()
    hook.write_text(HOOK_LINE, encoding="utf-8")
    try:
        return run_mutmut_now(work, args, minutes, by_line)
    finally:
        hook.unlink(missing_ok=True)


def run_mutmut_now(work: Path, args: list[str], minutes: float, by_line: bool = False) -> int:
    """mutmut in `work`, niced, in a session of its own; stopped after `minutes`, or when this
    command is interrupted, by a SIGINT to mutmut alone: it then ends the mutant it is testing
    (whose verdict is not recorded) and keeps every verdict it has."""
    # mutmut's own command line, with each mutant's tests ordered by the kills so far (ordered_run.py).
    ordered_run = work / "tools" / "mutation" / "ordered_run.py"
    environ = dict(os.environ, **{KILLERS_VARIABLE: str(work / "killers.tsv"),
                                  EQUIVALENT_VARIABLE: str(work / "equivalent.names")})
    if by_line:
        environ.update({REACH_VARIABLE: str(work / REACH), LINES_RAN_VARIABLE: str(work / LINES)})
    process = subprocess.Popen(["nice", "-n", "10", sys.executable, str(ordered_run), *args], cwd=work, env=environ,
                               start_new_session=True, preexec_fn=_default_sigint)
    try:
        return process.wait(timeout=minutes * 60)
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as stop:
        if isinstance(stop, subprocess.TimeoutExpired):
            print(f"stopping the run after {minutes:g} minutes", file=sys.stderr)
        process.send_signal(signal.SIGINT)
        try:
            return process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            return process.wait()


def forget(work: Path, target: Target, marked: dict[str, str], survivors: bool, names: list[str],
           equivalent_too: bool = False) -> None:
    """Mark mutants whose test run was interrupted (and with `survivors`, those left that are not
    marked equivalent) as not checked, so that this run tests them: mutmut keeps a verdict while
    the function is unchanged, and tests only mutants without one. With `names` (globs), only
    mutants that match: the others keep their verdicts, as the run leaves them alone."""
    from mutmut.stats import status_by_exit_code

    for source in target.sources:
        meta = work / "mutants" / f"{source}.meta"
        if not meta.is_file():
            continue
        data = json.loads(meta.read_text(encoding="utf-8"))
        codes = data["exit_code_by_key"]
        again = [k for k, code in codes.items() if status_by_exit_code[code] == "check was interrupted by user"
                 or (status_by_exit_code[code] == "skipped" and (equivalent_too or k not in marked))
                 or (survivors and status_by_exit_code[code] in LEFT and k not in marked
                     and (not names or any(fnmatch.fnmatch(k, name) for name in names)))]
        if again:
            codes.update(dict.fromkeys(again))
            meta.write_text(json.dumps(data, indent=4), encoding="utf-8")


def report(name: str, target: Target, work: Path, diffs: bool = False) -> int:
    """The module's score on stdout, and the mutants left that are not marked equivalent (with
    `diffs`, each one's change to the source)."""
    found = statuses(work, target)
    marked = equivalents(work, target)
    caught = [k for k, s in found.items() if s in CAUGHT]
    left = sorted(k for k, s in found.items() if s in LEFT)
    equivalent = [k for k in left if k in marked]
    open_ = [k for k in left if k not in marked]
    unchecked = [k for k, s in found.items() if s not in CAUGHT | LEFT]
    judged = len(caught) + len(open_)
    score = 100.0 * len(caught) / judged if judged else 0.0
    commit = (work / "COMMIT").read_text(encoding="utf-8").strip()[:12] if (work / "COMMIT").is_file() else "?"
    print(f"{name} at {commit}: {len(found)} mutants, {len(caught)} killed, {len(left)} left of which "
          f"{len(equivalent)} equivalent, {len(unchecked)} not checked; score {score:.1f}% of {judged} non-equivalent "
          f"checked mutants (tests: {' '.join(target.tests)})")
    mutmut = Path(sys.executable).with_name("mutmut")
    for key in open_:
        print(f"    {key}: {found[key]}")
        if diffs:
            shown = subprocess.run([str(mutmut), "show", key], cwd=work, capture_output=True, text=True)
            changed = [line for line in shown.stdout.splitlines()
                       if line[:1] in "+-" and not line.startswith(("+++", "---"))]
            print("".join(f"        {line}\n" for line in changed), end="")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.mutation", description=__doc__)
    parser.add_argument("module", nargs="?", choices=sorted(TARGETS))
    parser.add_argument("--list", action="store_true", help="the modules, their sources and tests")
    parser.add_argument("--minutes", type=float, default=20.0, help="stop the run after this long (20)")
    parser.add_argument("--max-children", type=int, default=1, help="mutants tested at once (1)")
    parser.add_argument("--retest", action="store_true",
                        help="test again the mutants left (after tests were added), with those not checked yet")
    parser.add_argument("--report", action="store_true", help="only report the last run's results")
    parser.add_argument("--equivalents", action="store_true",
                        help="test the mutants equivalent.txt marks too (an entry's digest covers only the lines its "
                             "mutant changes: a check of the judgments after their functions changed)")
    parser.add_argument("--save", action="store_true",
                        help="only write the last run's verdicts to tools/mutation/record/MODULE.tsv")
    parser.add_argument("--stamp", action="store_true",
                        help="add to each equivalent.txt entry of the module without one the digest of its change")
    parser.add_argument("--diffs", action="store_true", help="show how each mutant left changes the source")
    parser.add_argument("--lines", action="store_true",
                        help="first record the lines each test runs, so that a mutant is tested only by the tests "
                             "that run its change (kept for the next runs while the code and tests are unchanged)")
    parser.add_argument("names", nargs="*", metavar="MUTANT", help="only these mutants (globs allowed)")
    args = parser.parse_intermixed_args()  # MUTANT names may follow the options
    if args.list or args.module is None:
        for name, target in TARGETS.items():
            print(f"{name}: {' '.join(target.sources)}  <-  {' '.join(target.tests)}")
        return 0
    target = TARGETS[args.module]
    if importlib.util.find_spec("mutmut") is None:
        print("python -m tools.mutation: mutmut is not installed in this Python; install it with "
              "`pip install -e '.[test,mutation]'`", file=sys.stderr)
        return 2
    if args.report:  # the last run's folder as it is: its COMMIT is the one that run scored
        return report(args.module, target, WORK / args.module, args.diffs)
    if args.stamp:
        return stamp_equivalents(WORK / args.module, target)
    if args.save:
        save_record(args.module, target, WORK / args.module)
        return 0
    work = prepare(args.module, target)
    marked = equivalents(work, target)  # once: it makes every mutant of the module (seconds)
    # The mutants ordered_run.py records as skipped instead of testing them.
    skipped = [] if args.equivalents else sorted(marked)
    (work / "equivalent.names").write_text("".join(f"{key}\n" for key in skipped), encoding="utf-8")
    forget(work, target, marked, survivors=args.retest, names=args.names, equivalent_too=args.equivalents)
    commit = (work / "COMMIT").read_text(encoding="utf-8").strip()
    by_line = lines_in_use(work, commit, quiet=args.lines)
    if args.lines and not by_line:
        if collect_lines(work, target) != 0:
            return 1
        by_line = True
    if by_line:
        write_reach(work, target)
    run_mutmut(work, ["run", "--max-children", str(args.max_children), *args.names], args.minutes, by_line)
    save_record(args.module, target, work)
    return report(args.module, target, work, args.diffs)


def save_record(name: str, target: Target, work: Path) -> None:
    """Keep the run's verdicts and killers in tools/mutation/record/NAME.tsv (record.py), for
    runs on other machines: commit it with the scores."""
    from mutmut import __version__
    from mutmut.stats import status_by_exit_code

    RECORDS.mkdir(exist_ok=True)
    found = record.collect(work, target.sources, status_by_exit_code, __version__)
    (RECORDS / f"{name}.tsv").write_text(record.render(found), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
