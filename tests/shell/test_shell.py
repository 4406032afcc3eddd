"""`qnnctl env` output evaluated by real shells, and the rendering rules of each shell.

Every real-shell test runs the real entry point through a `qnnctl` wrapper on PATH, evals
its output the way a start-up file would, and reads the variables back twice: as the shell
sees them and as a child process receives them (`env -0`). Both must equal the expected
strings exactly.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from qnnctl.errors import UsageError
from qnnctl.shell.detect import detect_shell, process_shell
from qnnctl.shell.exports import MARKER, apply, check_cache_path, sdk_environment, unset_environment
from qnnctl.shell.render import quote_fish, quote_nu, quote_posix, quote_powershell, render
from tests.conftest import require_tool
from tests.sdkfactory import OTHER_VERSION, VERSION, build_sdk_tree, install_tree_into_cache

VARS = ("QNN_SDK_ROOT", "LD_LIBRARY_PATH", "PATH", MARKER)
LIB = "lib/x86_64-linux-clang"
BIN = "bin/x86_64-linux-clang"

Values = dict[str, "str | None"]


@dataclass(frozen=True)
class Shell:
    name: str  # the --shell value
    exe: str
    flags: tuple[str, ...]

    @property
    def fish(self) -> bool:
        return self.name == "fish"

    def eval_line(self, args: Sequence[str], detect: bool = False) -> str:
        """One `qnnctl env` evaluated as a user would, failing the script if qnnctl fails.

        With `detect`, no --shell: exactly the README's line, and qnnctl must tell the shell.
        A `false` after it ends the script if the output switched on exit-on-error (fish's
        `set -e NAME` read by a POSIX shell).
        """
        if detect:
            if self.fish:
                return " ".join(["qnnctl env", *(quote_fish(a) for a in args), "| source"])
            return 'eval "$(qnnctl env' + "".join(" " + shlex.quote(a) for a in args) + ')"\nfalse'
        if self.fish:
            quoted = " ".join(quote_fish(a) for a in args)
            return f"qnnctl env --shell fish {quoted} | source; test $pipestatus[1] -eq 0; or exit 97"
        quoted = " ".join(shlex.quote(a) for a in args)
        return f'out="$(qnnctl env --shell {self.name} {quoted})" || exit 97\neval "$out"'

    def dump(self) -> str:
        """Print each variable as the shell sees it, then the exported environment."""
        lines = []
        for name in VARS:
            if self.fish:
                lines.append(
                    f"if set -q {name}; printf '%s\\0' \"{name}=set:${name}\"; "
                    f"else; printf '%s\\0' '{name}=unset'; end"
                )
            else:
                lines.append(
                    f'if [ -n "${{{name}+x}}" ]; then printf "%s\\000" "{name}=set:${name}"; '
                    f"else printf '%s\\000' '{name}=unset'; fi"
                )
        lines.append("command env -0")
        nul = "\\0" if self.fish else "\\000"
        lines.append(f"printf '%s{nul}' {END}")
        return "\n".join(lines)


SHELLS = {
    "bash": Shell("bash", "bash", ("--norc", "--noprofile")),
    "sh": Shell("sh", "dash", ()),
    "zsh": Shell("zsh", "zsh", ("-f",)),
    "fish": Shell("fish", "fish", ("--no-config",)),
}


END = "--end-of-dump--"


def _parse(out: bytes) -> list[tuple[Values, Values]]:
    """Each dump: the variables as the shell saw them, and as its child received them."""
    records = out.decode("utf-8", "surrogateescape").split("\0")
    dumps = []
    while len(records) > 1:
        end = records.index(END)
        dump, records = records[:end], records[end + 1:]
        seen: Values = {}
        for record in dump[: len(VARS)]:
            name, _, rest = record.partition("=")
            seen[name] = rest.removeprefix("set:") if rest.startswith("set:") else None
        child: Values = dict.fromkeys(VARS)
        for record in dump[len(VARS):]:
            name, _, value = record.partition("=")
            if name in child:
                child[name] = value
        dumps.append((seen, child))
    return dumps


@dataclass(frozen=True)
class Export:
    """A line the user types between two `qnnctl env`: export NAME=VALUE in the shell's syntax."""

    name: str
    value: str

    def line(self, shell: Shell) -> str:
        if shell.fish:
            return f"set -gx {self.name} {quote_fish(self.value)}"
        return f"export {self.name}={quote_posix(self.value)}"


@dataclass
class Session:
    """A shell started with a given environment, which evals a sequence of `qnnctl env`
    (an argument list each), with the user's own exports (`Export`) in between."""

    shell: Shell
    env: dict[str, str]
    cwd: Path
    detect: bool = False  # evaluate without --shell

    def run(self, *invocations: Sequence[str] | Export) -> Values:
        """The variables after evaluating all the invocations."""
        return self._run(invocations, dump_each=False)[-1]

    def run_each(self, *invocations: Sequence[str] | Export) -> list[Values]:
        """The variables after each invocation, all in one shell."""
        return self._run(invocations, dump_each=True)

    def _run(self, invocations: Sequence[Sequence[str] | Export], dump_each: bool) -> list[Values]:
        exe = require_tool(self.shell.exe)
        lines = []
        for args in invocations:
            lines.append(args.line(self.shell) if isinstance(args, Export) else self.shell.eval_line(args, self.detect))
            if dump_each:
                lines.append(self.shell.dump())
        if not dump_each:
            lines.append(self.shell.dump())
        proc = subprocess.run([exe, *self.shell.flags, "-c", "\n".join(lines)], env=self.env, cwd=self.cwd,
                              capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        dumps = _parse(proc.stdout)
        assert len(dumps) == (len(invocations) if dump_each else 1)
        for seen, child in dumps:
            # What the shell holds is what its children receive.
            assert seen == child
        return [seen for seen, _ in dumps]


def _wrapper(folder: Path) -> Path:
    """A `qnnctl` command that runs this checkout's entry point with this interpreter."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "qnnctl"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m qnnctl "$@"\n')
    script.chmod(0o755)
    return folder


def _session(shell: Shell, tmp_path: Path, ld: str | None, **extra: str) -> Session:
    env = os.environ.copy()
    # A duplicate and an odd entry in the user's PATH: both must survive in their order.
    env["PATH"] = f"{_wrapper(tmp_path / 'user bin')}:/usr/bin:/bin:/usr/bin"
    if ld is not None:
        env["LD_LIBRARY_PATH"] = ld
    env.update(extra)
    return Session(shell, env, Path.cwd())


def _join(entry: str, rest: str | None) -> str:
    return f"{entry}:{rest}" if rest else entry


def _expected(root: Path, user: dict[str, str]) -> Values:
    return {
        "QNN_SDK_ROOT": str(root),
        "LD_LIBRARY_PATH": _join(str(root / LIB), user.get("LD_LIBRARY_PATH")),
        "PATH": _join(str(root / BIN), user["PATH"]),
    }


def _user(session: Session) -> Values:
    return {name: session.env.get(name) for name in VARS}


def _check_marker(values: Values, root: Path) -> None:
    marker = values[MARKER]
    assert marker is not None
    assert json.loads(marker)["root"] == str(root)


SHELL_IDS = list(SHELLS)
# Unset, the empty value, and a value with a space and an empty entry (the cwd) in it.
LD_CASES = {"ld-unset": None, "ld-empty": "", "ld-set": "/opt/user one::/usr/lib/user2"}


@pytest.fixture
def sdks(cache_dir: Path) -> tuple[Path, Path]:
    return install_tree_into_cache(cache_dir, VERSION), install_tree_into_cache(cache_dir, OTHER_VERSION)


@pytest.mark.parametrize("ld", list(LD_CASES.values()), ids=list(LD_CASES))
@pytest.mark.parametrize("shell", SHELL_IDS)
def test_eval_once_and_twice(shell: str, ld: str | None, sdks: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = sdks
    session = _session(SHELLS[shell], tmp_path, ld)
    user = {k: v for k, v in _user(session).items() if v is not None}
    once, twice = session.run_each([VERSION], [VERSION])
    expected = _expected(root, user)
    assert {k: once[k] for k in expected} == expected
    _check_marker(once, root)
    assert twice == once


@pytest.mark.parametrize("ld", list(LD_CASES.values()), ids=list(LD_CASES))
@pytest.mark.parametrize("shell", SHELL_IDS)
def test_switch_versions(shell: str, ld: str | None, sdks: tuple[Path, Path], tmp_path: Path) -> None:
    root_a, root_b = sdks
    session = _session(SHELLS[shell], tmp_path, ld)
    user = {k: v for k, v in _user(session).items() if v is not None}
    values = session.run([VERSION], [OTHER_VERSION])
    expected = _expected(root_b, user)
    assert {k: values[k] for k in expected} == expected
    _check_marker(values, root_b)
    for value in values.values():
        assert str(root_a) not in (value or "")


@pytest.mark.parametrize("ld", list(LD_CASES.values()), ids=list(LD_CASES))
@pytest.mark.parametrize("shell", SHELL_IDS)
def test_unset_restores_the_users_values(shell: str, ld: str | None, sdks: tuple[Path, Path],
                                         tmp_path: Path) -> None:
    session = _session(SHELLS[shell], tmp_path, ld)
    user = _user(session)
    # Nothing exported yet: --unset changes nothing.
    assert session.run(["--unset"]) == user
    steps = session.run_each([VERSION], ["--unset"], [VERSION], [OTHER_VERSION], [VERSION], ["--unset"],
                             ["--unset"])
    assert steps[1] == user
    assert steps[5] == user
    assert steps[6] == user


@pytest.mark.parametrize("shell", SHELL_IDS)
def test_users_own_sdk_root(shell: str, sdks: tuple[Path, Path], tmp_path: Path) -> None:
    """A QNN_SDK_ROOT qnnctl did not set is used as is and never unset; one it replaced comes back."""
    mine = build_sdk_tree(tmp_path / "my sdk")
    session = _session(SHELLS[shell], tmp_path, None, QNN_SDK_ROOT=str(mine))
    user = _user(session)
    steps = session.run_each([], [], ["--unset"], [VERSION], ["--unset"], [VERSION], [])
    assert steps[0]["QNN_SDK_ROOT"] == str(mine)
    assert steps[0]["LD_LIBRARY_PATH"] == str(mine / LIB)
    assert steps[1] == steps[0]
    assert steps[2] == user
    # An explicit version wins over it for the session, and --unset gives it back.
    root_a, _ = sdks
    assert steps[3]["QNN_SDK_ROOT"] == str(root_a)
    assert steps[4] == user
    # Without a version, the user's own root is the choice again, and nothing of A is left.
    assert steps[6] == steps[0]


@pytest.mark.parametrize("before", [None, "", "/opt/replaced"], ids=["root-unset", "root-empty", "root-set"])
@pytest.mark.parametrize("shell", SHELL_IDS)
def test_a_root_the_user_exported_since_is_theirs(shell: str, before: str | None, sdks: tuple[Path, Path],
                                                  tmp_path: Path) -> None:
    """After `qnnctl env VERSION`, the user exports a QNN_SDK_ROOT of their own: --unset keeps it
    (it neither puts back the value qnnctl replaced nor unsets it), and `qnnctl env` chooses it."""
    mine = build_sdk_tree(tmp_path / "my sdk")
    extra = {} if before is None else {"QNN_SDK_ROOT": before}
    session = _session(SHELLS[shell], tmp_path, None, **extra)
    user = _user(session)
    root_a, _ = sdks
    exported, theirs, unset, chosen = session.run_each(
        [VERSION], Export("QNN_SDK_ROOT", str(mine)), ["--unset"], [])
    assert exported["QNN_SDK_ROOT"] == str(root_a)
    assert theirs["QNN_SDK_ROOT"] == str(mine)
    # Everything qnnctl added is gone, and the root is the one the user exported last.
    assert unset == {**user, "QNN_SDK_ROOT": str(mine)}
    assert chosen["QNN_SDK_ROOT"] == str(mine)
    assert chosen["LD_LIBRARY_PATH"] == str(mine / LIB)
    # The same when the user's export comes right before `qnnctl env` (no --unset between).
    switched = session.run([VERSION], Export("QNN_SDK_ROOT", str(mine)), [])
    assert switched == chosen
    assert str(root_a) not in json.dumps(switched)


# -- which shell reads the output ----------------------------------------------------------

# Each shell runs with SHELL naming another one, as when it was started from a login shell of
# another kind: the syntax must be the running shell's all the same.
OTHER_LOGIN_SHELL = {"bash": "/usr/bin/fish", "sh": "/usr/bin/fish", "zsh": "/usr/bin/fish", "fish": "/bin/bash"}


@pytest.mark.parametrize("shell", SHELL_IDS)
def test_the_shell_that_runs_qnnctl_is_detected(shell: str, sdks: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = sdks
    session = _session(SHELLS[shell], tmp_path, "/opt/user", SHELL=OTHER_LOGIN_SHELL[shell])
    session.detect = True
    user = _user(session)
    exported, unset, again, unset_twice = session.run_each([VERSION], ["--unset"], [VERSION], ["--unset"])
    expected = _expected(root, {k: v for k, v in user.items() if v is not None})
    assert {k: exported[k] for k in expected} == expected
    _check_marker(exported, root)
    assert unset == user
    assert again == exported
    assert unset_twice == user


def test_bash_started_from_fish_gets_bash_syntax(sdks: tuple[Path, Path], tmp_path: Path) -> None:
    """The report: typed in fish, `bash -c 'eval "$(qnnctl env --unset)"'` got `set -e NAME`,
    which switched on bash's exit-on-error."""
    fish = require_tool("fish")
    require_tool("bash")
    env = _session(SHELLS["fish"], tmp_path, None, SHELL="/usr/bin/fish").env
    inner = (f'eval "$(qnnctl env {VERSION})"; printf "%s\\n" "$QNN_SDK_ROOT"; '
             'eval "$(qnnctl env --unset)"; false; printf "alive:%s\\n" "${QNN_SDK_ROOT-unset}"')
    proc = subprocess.run([fish, "--no-config", "-c", f"bash --norc --noprofile -c {quote_fish(inner)}"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(sdks[0]), "alive:unset"]


def test_a_launcher_between_shell_and_qnnctl_is_looked_through(sdks: tuple[Path, Path], tmp_path: Path) -> None:
    bash = require_tool("bash")
    timeout = require_tool("timeout")
    env = _session(SHELLS["bash"], tmp_path, None, SHELL="/usr/bin/fish").env
    script = f'eval "$({timeout} 60 qnnctl env {VERSION})"; printf "%s\\n" "$QNN_SDK_ROOT"'
    proc = subprocess.run([bash, "--norc", "--noprofile", "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{sdks[0]}\n"


def test_a_shell_that_is_pid_1_is_detected(sdks: tuple[Path, Path], tmp_path: Path) -> None:
    """In a container the shell is often PID 1 (`docker run IMAGE bash -c 'eval "$(qnnctl env)"'`),
    and qnnctl its child: bash syntax, although $SHELL names fish. Run in a PID namespace of its own."""
    unshare = require_tool("unshare")
    require_tool("bash")
    flags = ["--pid", "--fork", "--mount-proc"] + ([] if os.geteuid() == 0 else ["--user", "--map-root-user"])
    if subprocess.run([unshare, *flags, "true"], capture_output=True).returncode != 0:
        pytest.skip("this host does not let an unprivileged process make a PID namespace")
    root, _ = sdks
    env = _session(SHELLS["bash"], tmp_path, None, SHELL="/usr/bin/fish").env
    script = f'eval "$(qnnctl env {VERSION})"\necho "pid=$$ root=$QNN_SDK_ROOT"'
    result = subprocess.run([unshare, *flags, "bash", "--norc", "--noprofile", "-c", script], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"pid=1 root={root}\n", result.stderr


def test_shell_option_wins_over_the_running_shell(sdks: tuple[Path, Path], tmp_path: Path) -> None:
    bash = require_tool("bash")
    env = _session(SHELLS["bash"], tmp_path, None, SHELL="/bin/bash").env
    proc = subprocess.run([bash, "--norc", "--noprofile", "-c", f"qnnctl env {VERSION} --shell fish; :"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("set -gx QNN_SDK_ROOT ")


def _sleeper(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


@pytest.mark.parametrize(("exe", "expected"), [("bash", "bash"), ("dash", "sh"), ("zsh", "zsh"), ("fish", "fish")])
def test_process_shell_names_a_running_shell(exe: str, expected: str) -> None:
    # The trailing command keeps each shell from exec'ing sleep in its own place.
    proc = _sleeper([require_tool(exe), "-c", "sleep 30; echo done"])
    try:
        assert process_shell(proc.pid) == expected
    finally:
        proc.kill()
        proc.wait()


def test_process_shell_is_none_for_a_program_that_is_no_shell() -> None:
    proc = _sleeper([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert process_shell(proc.pid) is None
        assert process_shell(0) is None  # no parent known
        assert process_shell(2**22 + 12345) is None  # no such process
    finally:
        proc.kill()
        proc.wait()


class Named:
    """A Python process that renames itself (its /proc comm) to `comm`, then waits; started by
    the command `argv` when given (a launcher), as that command's child."""

    def __init__(self, comm: bytes, argv: Sequence[str] = ()) -> None:
        code = (f"import os, sys; open('/proc/self/comm', 'wb').write({comm!r}); print(os.getpid(), flush=True); "
                "sys.stdin.read()")
        self.proc = subprocess.Popen([*argv, sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.pid = int(self.proc.stdout.readline())

    def __enter__(self) -> Named:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def test_a_process_name_with_parentheses_spaces_and_bad_bytes() -> None:
    """/proc/PID/stat puts the name between parentheses, and a name may hold ')' and ' ' and
    bytes that are not UTF-8: the parent pid is read after the last ')', and nothing raises."""
    from qnnctl.shell.detect import _parent_pid

    with Named(b"a) b) \xff\xfe") as child:
        assert _parent_pid(child.pid) == os.getpid()
        assert process_shell(child.pid) is None


def test_the_process_name_alone_can_make_a_shell() -> None:
    """A process whose name (comm) is a shell's is taken for one, whatever its executable."""
    with Named(b"fish") as child:
        assert process_shell(child.pid) == "fish"


def test_a_shell_whose_executable_was_deleted(tmp_path: Path) -> None:
    """Upgraded while it runs: /proc/PID/exe reads "/usr/bin/dash (deleted)". Started through a
    link of another name, the executable is all that tells the shell."""
    copy = tmp_path / "bin" / "dash"
    copy.parent.mkdir()
    shutil.copy2(require_tool("dash"), copy)
    (tmp_path / "started-as").symlink_to(copy)
    proc = _sleeper([str(tmp_path / "started-as"), "-c", "sleep 30; echo done"])
    try:
        copy.unlink()
        assert os.readlink(f"/proc/{proc.pid}/exe").endswith("/dash (deleted)")
        assert process_shell(proc.pid) == "sh"
    finally:
        proc.kill()
        proc.wait()


def test_a_launcher_is_known_by_its_executable(tmp_path: Path) -> None:
    """`timeout` started through a link of another name: its executable names it a launcher, so
    the shell above it is found."""
    (tmp_path / "tmo").symlink_to(require_tool("timeout"))
    # The trailing `true` keeps bash from exec'ing the launcher in its own place.
    with Named(b"pipeline", ["bash", "-c", '"$0" 60 "$@"; true', str(tmp_path / "tmo")]) as child:
        launcher = int(Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert Path(f"/proc/{launcher}/comm").read_text().strip() == "tmo"
        assert process_shell(launcher) == "bash"
        assert process_shell(child.pid) is None  # not a launcher: the walk stops at it


# -- hostile cache folders ---------------------------------------------------------------

HOSTILE = {
    "space": "with space",
    "single-quote": "it's",
    "double-quote": 'say "hi"',
    "dollar": "cost$HOME$1${PATH}",
    "backtick": "tick`touch pwned`",
    "command-substitution": "$(touch pwned)",
    "semicolon": "a;touch pwned;b",
    "non-ascii": "çache-日本語-ünï",
    "backslash": "back\\slash\\'\\n",
    "glob-and-braces": "*?[ab]{c,d}~",
    "typographic-quotes": "\u2018left\u2019 \u201cdq\u201d",
    "everything": "a b'c\"d$e`touch pwned`$(touch pwned);touch pwned;é\\{x,y}*",
}


@pytest.mark.parametrize("name", list(HOSTILE.values()), ids=list(HOSTILE))
@pytest.mark.parametrize("shell", SHELL_IDS)
def test_hostile_cache_path_round_trips(shell: str, name: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "caches" / name / "qnnctl"
    root = install_tree_into_cache(cache, VERSION)
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(cache))
    session = _session(SHELLS[shell], tmp_path, "/usr/lib/user")
    user = _user(session)
    once, twice, unset = session.run_each([VERSION], [VERSION], ["--unset"])
    expected = _expected(root, {k: v for k, v in user.items() if v is not None})
    assert {k: once[k] for k in expected} == expected
    _check_marker(once, root)
    assert twice == once
    assert unset == user
    assert list(tmp_path.rglob("pwned")) == []


@pytest.mark.parametrize("name", ["new\nline", "carriage\rreturn"], ids=["newline", "cr"])
def test_path_with_a_newline_is_refused(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import run_qnnctl

    cache = tmp_path / name
    install_tree_into_cache(cache, VERSION)
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(cache))
    for shell in ("bash", "fish", "json", "dotenv"):
        result = run_qnnctl("env", VERSION, "--shell", shell)
        assert result.returncode == 2, result.stderr
        assert result.stdout == ""
        assert "newline" in result.stderr


def test_colon_in_a_path_list_entry_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import run_qnnctl

    cache = tmp_path / "a:b"
    install_tree_into_cache(cache, VERSION)
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(cache))
    result = run_qnnctl("env", VERSION, "--shell", "bash")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "cannot hold a ':'" in result.stderr


@pytest.mark.parametrize(("flaw", "what"), [
    (":", "a ':'"), ("\n", "a newline"), ("\r", "a carriage return"), ("\x00", "a NUL"),
    ("\udcff", "bytes that are not valid text in this locale"),
], ids=["colon", "newline", "carriage-return", "nul", "undecodable"])
def test_a_cache_no_path_list_can_hold_is_named_with_its_flaw(flaw: str, what: str) -> None:
    root = f"/srv/cache{flaw}x"
    with pytest.raises(UsageError) as caught:
        check_cache_path(root)
    assert caught.value.message == (f"the cache {root!r} has {what} in its path: an SDK installed there "
                                    "could not be put on LD_LIBRARY_PATH and PATH")
    assert caught.value.hint == "point QNNCTL_CACHE_DIR at a folder whose path has no ':' and no newline"
    assert caught.value.exit_code == 2


def test_a_cache_with_an_ordinary_path_is_accepted() -> None:
    check_cache_path("/home/user one/.cache/qnnctl-é")  # does not raise


# -- rendering (shells that are not installed here, and the rules themselves) ----------

SAMPLE: Values = {
    "QNN_SDK_ROOT": "/c/it's ‘q’ ‚l‛ \"d\" $x `y` \\z",
    "LD_LIBRARY_PATH": None,
    "PATH": "/a b:/c'd",
}


def test_render_posix_exact() -> None:
    expected = (
        "export QNN_SDK_ROOT='/c/it'\\''s ‘q’ ‚l‛ \"d\" $x `y` \\z'\n"
        "unset LD_LIBRARY_PATH\n"
        "export PATH='/a b:/c'\\''d'\n"
    )
    for shell in ("sh", "bash", "zsh"):
        assert render(SAMPLE, shell) == expected


def test_render_fish_exact() -> None:
    assert render(SAMPLE, "fish") == (
        "set -gx QNN_SDK_ROOT '/c/it\\'s ‘q’ ‚l‛ \"d\" $x `y` \\\\z'\n"
        "set -e LD_LIBRARY_PATH\n"
        "set -gx PATH '/a b' '/c\\'d'\n"
    )


def test_render_powershell_doubles_every_single_quote() -> None:
    assert render(SAMPLE, "powershell") == (
        "$env:QNN_SDK_ROOT = '/c/it''s ‘‘q’’ ‚‚l‛‛ \"d\" $x `y` \\z'\n"
        "Remove-Item -Path Env:LD_LIBRARY_PATH -ErrorAction SilentlyContinue\n"
        "$env:PATH = '/a b:/c''d'\n"
    )
    assert quote_powershell("plain") == "'plain'"
    assert quote_powershell("'") == "''''"


def test_render_nu_escapes_double_quotes() -> None:
    assert render(SAMPLE, "nu") == (
        "$env.QNN_SDK_ROOT = \"/c/it's ‘q’ ‚l‛ \\\"d\\\" $x `y` \\\\z\"\n"
        "hide-env --ignore-errors LD_LIBRARY_PATH\n"
        "$env.PATH = [\"/a b\", \"/c'd\"]\n"
    )
    # nu spells control characters \u{..} (JSON's \u0001 is not nu syntax).
    assert quote_nu("a\tb\x01c\x7f") == '"a\\u{9}b\\u{1}c\\u{7f}"'
    assert quote_nu("$(x) (y)") == '"$(x) (y)"'


def test_render_json_and_dotenv() -> None:
    assert json.loads(render(SAMPLE, "json")) == SAMPLE
    # Two spaces of indent, one key a line, text as it is (not \u escapes), the unset as null.
    assert render({"QNN_SDK_ROOT": "/opt/qairt/é", "LD_LIBRARY_PATH": None}, "json") == \
        '{\n  "QNN_SDK_ROOT": "/opt/qairt/é",\n  "LD_LIBRARY_PATH": null\n}\n'
    assert render(SAMPLE, "dotenv") == f"QNN_SDK_ROOT={SAMPLE['QNN_SDK_ROOT']}\nPATH=/a b:/c'd\n"


@pytest.mark.parametrize("bad", ["a\x00b", "a\nb", "a\rb", "a\udcffb"], ids=["nul", "newline", "cr", "undecodable"])
@pytest.mark.parametrize("shell", ["sh", "bash", "zsh", "fish", "powershell", "nu", "json", "dotenv"])
def test_render_refuses_values_no_shell_can_carry(bad: str, shell: str) -> None:
    with pytest.raises(UsageError) as info:
        render({"QNN_SDK_ROOT": bad}, shell)
    assert info.value.exit_code == 2
    assert str(info.value).startswith(f"cannot export QNN_SDK_ROOT: the path {bad!r} ")


def test_quoting_is_exact_for_posix_and_fish() -> None:
    assert quote_posix("it's") == "'it'\\''s'"
    assert quote_fish("a\\'b") == "'a\\\\\\'b'"


def test_unknown_shell_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as caught:
        render({"PATH": "/x"}, "tcsh")
    assert caught.value.message == "unknown shell 'tcsh'"
    assert caught.value.hint == "choose one of: bash, zsh, sh, fish, powershell, nu, json, dotenv"


def test_apply_unsets_what_is_not_there_too() -> None:
    assert apply({"PATH": "/usr/bin"}, {"LD_LIBRARY_PATH": None, "QNN_SDK_ROOT": "/sdk"}) == {
        "PATH": "/usr/bin", "QNN_SDK_ROOT": "/sdk"}


def test_the_marker_is_compact_json() -> None:
    """Exported into every process' environment: no space that JSON does not need."""
    from qnnctl.shell.exports import Marker

    marker = Marker("/s d", True, {"PATH": ["/s d/bin"]}, ["LD_LIBRARY_PATH"], "/é")
    assert marker.dumps() == ('{"added":{"PATH":["/s d/bin"]},"owns_root":true,"previous_root":"/é",'
                              '"root":"/s d","was_unset":["LD_LIBRARY_PATH"]}')


@pytest.mark.parametrize(("value", "shell"), [
    ("/bin/bash", "bash"), ("/usr/bin/zsh", "zsh"), ("/usr/bin/fish", "fish"),
    ("/bin/dash", "sh"), ("/bin/sh", "sh"), ("/usr/bin/pwsh", "powershell"), ("/usr/local/bin/nu", "nu"),
    ("/bin/tcsh", "sh"), ("", "sh"), ("/usr/bin/json", "sh"),
])
def test_detect_shell(value: str, shell: str) -> None:
    assert detect_shell({"SHELL": value}) == shell


def test_detect_shell_without_shell_variable() -> None:
    assert detect_shell({}) == "sh"


def test_detect_shell_prefers_the_parent_and_falls_back_to_shell_variable() -> None:
    fish = require_tool("fish")
    proc = _sleeper([fish, "--no-config", "-c", "sleep 30; echo done"])
    try:
        assert detect_shell({"SHELL": "/bin/bash"}, proc.pid) == "fish"
    finally:
        proc.kill()
        proc.wait()
    # Not a shell (this test's own interpreter): $SHELL, then sh.
    assert detect_shell({"SHELL": "/usr/bin/zsh"}, os.getpid()) == "zsh"
    assert detect_shell({}, os.getpid()) == "sh"


@pytest.mark.parametrize(("name", "shell"), [
    ("bash", "bash"), ("-zsh", "zsh"), ("ksh93", "sh"), ("/usr/bin/fish", "fish"),
    ("bash-5.2", "bash"), ("pwsh", "powershell"), ("python3.12", None), ("", None),
    ("/usr/bin/zsh/", "zsh"), ("bashX", None), ("Xbash", None), ("--fish", "fish"),
])
def test_shell_names(name: str, shell: str | None) -> None:
    from qnnctl.shell.detect import _shell_name

    assert _shell_name(name) == shell


# -- the change as data --------------------------------------------------------------------


def _env(root: str, environ: dict[str, str], owns_root: bool = True) -> dict[str, str]:
    values = sdk_environment(environ, root, [f"{root}/{LIB}"], [f"{root}/{BIN}"], owns_root)
    return apply(environ, values)


def test_unset_ld_library_path_gets_no_empty_entry() -> None:
    after = _env("/sdk", {"PATH": "/usr/bin"})
    assert after["LD_LIBRARY_PATH"] == f"/sdk/{LIB}"
    assert after["PATH"] == f"/sdk/{BIN}:/usr/bin"


def test_entry_already_present_is_not_added_and_not_removed() -> None:
    user = {"PATH": f"/usr/bin:/sdk/{BIN}", "LD_LIBRARY_PATH": f"/x:/sdk/{LIB}"}
    after = _env("/sdk", user)
    assert after["PATH"] == user["PATH"]
    assert after["LD_LIBRARY_PATH"] == user["LD_LIBRARY_PATH"]
    assert apply(after, unset_environment(after)) == user


def test_empty_user_value_comes_back_empty() -> None:
    user = {"PATH": "/usr/bin", "LD_LIBRARY_PATH": ""}
    after = _env("/sdk", user)
    assert after["LD_LIBRARY_PATH"] == f"/sdk/{LIB}"
    assert apply(after, unset_environment(after)) == user


def test_replaced_sdk_root_comes_back_and_users_root_is_kept() -> None:
    user = {"PATH": "/usr/bin", "QNN_SDK_ROOT": "/mine"}
    replaced = _env("/sdk", user)
    assert replaced["QNN_SDK_ROOT"] == "/sdk"
    assert apply(replaced, unset_environment(replaced)) == user
    kept = _env("/mine", user, owns_root=False)
    assert kept["QNN_SDK_ROOT"] == "/mine"
    assert "QNN_SDK_ROOT" not in unset_environment(kept)
    assert apply(kept, unset_environment(kept)) == user


@pytest.mark.parametrize("before", [None, "", "/replaced"], ids=["root-unset", "root-empty", "root-set"])
def test_a_root_exported_since_is_neither_put_back_nor_unset(before: str | None) -> None:
    user = {"PATH": "/usr/bin"} if before is None else {"PATH": "/usr/bin", "QNN_SDK_ROOT": before}
    after = _env("/sdk", user)
    theirs = {**after, "QNN_SDK_ROOT": "/theirs"}
    assert unset_environment(theirs)["QNN_SDK_ROOT"] == "/theirs"
    assert apply(theirs, unset_environment(theirs)) == {**user, "QNN_SDK_ROOT": "/theirs"}
    # `qnnctl env` again for another SDK replaces theirs, and so --unset gives theirs back.
    switched = _env("/other", theirs)
    assert switched["QNN_SDK_ROOT"] == "/other"
    assert apply(switched, unset_environment(switched)) == {**user, "QNN_SDK_ROOT": "/theirs"}
    # Unset since: it stays unset, and nothing of the marker's earlier value comes back.
    dropped = {k: v for k, v in after.items() if k != "QNN_SDK_ROOT"}
    assert unset_environment(dropped)["QNN_SDK_ROOT"] is None


def test_the_record_speaks_for_the_shell_only_while_the_root_is_qnnctls() -> None:
    from qnnctl.sdk.select import BY_ENV, BY_SHELL, select_sdk, shell_sdk_root, user_environ

    user = {"PATH": "/usr/bin", "QNN_SDK_ROOT": "/replaced"}
    after = _env("/sdk", user)
    assert shell_sdk_root(after) == "/sdk"
    assert user_environ(after) == user
    assert select_sdk(None, after, Path("/")).reason == BY_SHELL
    for exported in ("/theirs", "/sdk/", ""):
        theirs = {**after, "QNN_SDK_ROOT": exported}
        assert shell_sdk_root(theirs) is None, exported
        assert user_environ(theirs)["QNN_SDK_ROOT"] == exported
    chosen = select_sdk(None, {**after, "QNN_SDK_ROOT": "/theirs"}, Path("/"))
    assert (chosen.reason, chosen.root) == (BY_ENV, Path("/theirs"))
    # A record of a root that was the user's all along (owns_root false) speaks for nothing.
    kept = _env("/replaced", user, owns_root=False)
    assert shell_sdk_root(kept) is None
    assert select_sdk(None, kept, Path("/")).reason == BY_ENV


def test_a_path_list_unset_since_does_not_stop_the_undo_of_the_others() -> None:
    user = {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/mine"}
    after = _env("/sdk", user)
    dropped = {k: v for k, v in after.items() if k != "LD_LIBRARY_PATH"}  # unset by the user since
    assert apply(dropped, unset_environment(dropped)) == {"PATH": "/usr/bin"}


@pytest.mark.parametrize(("entry", "message", "hint"), [
    ("/sdk/a:b", "cannot add '/sdk/a:b' to LD_LIBRARY_PATH: a path list cannot hold a ':'",
     "move the SDK or the cache (QNNCTL_CACHE_DIR) to a path without ':'"),
    ("/sdk/a\nb", "cannot export LD_LIBRARY_PATH: the path '/sdk/a\\nb' contains a newline or NUL",
     "move the SDK or the cache (QNNCTL_CACHE_DIR) to a path without one"),
    ("/sdk/a\udcffb", "cannot export LD_LIBRARY_PATH: the path '/sdk/a\\udcffb' is not valid text in this locale",
     "move the SDK or the cache (QNNCTL_CACHE_DIR) to a path with a valid name"),
], ids=["colon", "newline", "undecodable"])
def test_a_library_folder_no_path_list_can_hold(entry: str, message: str, hint: str) -> None:
    with pytest.raises(UsageError) as caught:
        sdk_environment({}, "/sdk", [entry], [])
    assert (caught.value.message, caught.value.hint) == (message, hint)


def test_a_marker_made_with_defaults() -> None:
    from qnnctl.shell.exports import Marker

    assert Marker("/r", False).dumps() == ('{"added":{},"owns_root":false,"previous_root":null,"root":"/r",'
                                           '"was_unset":[]}')


def test_a_mangled_marker_undoes_nothing() -> None:
    environ = {"PATH": "/usr/bin", MARKER: "{not json", "QNN_SDK_ROOT": "/x"}
    assert unset_environment(environ) == {MARKER: None}
    environ[MARKER] = json.dumps({"root": "/x", "added": {"HOME": ["/"]}, "owns_root": True})
    # Only the path lists qnnctl manages can be edited through the marker.
    assert "HOME" not in unset_environment(environ)


def test_an_sdk_root_no_shell_can_carry_is_refused_by_name() -> None:
    with pytest.raises(UsageError) as caught:
        sdk_environment({}, "/sdk\nx", [], [])
    assert caught.value.message == "cannot export QNN_SDK_ROOT: the path '/sdk\\nx' contains a newline or NUL"


def test_the_sdk_environment_owns_qnn_sdk_root_unless_told_otherwise() -> None:
    environ = {"QNN_SDK_ROOT": "/theirs"}
    assert sdk_environment(environ, "/sdk", [], [])["QNN_SDK_ROOT"] == "/sdk"
    theirs = sdk_environment(environ, "/sdk", [], [], owns_root=False)
    assert theirs["QNN_SDK_ROOT"] == "/theirs"
    # Nothing of QNN_SDK_ROOT to give back on --unset: the marker records no previous root.
    assert json.loads(theirs[MARKER] or "")["previous_root"] is None


def test_a_path_list_with_nothing_to_add_stays_unset() -> None:
    values = sdk_environment({}, "/sdk", [], ["/sdk/bin"])
    assert (values["LD_LIBRARY_PATH"], values["PATH"]) == (None, "/sdk/bin")


def test_a_marker_naming_only_its_root_is_read_with_the_defaults() -> None:
    from qnnctl.shell.exports import Marker, read_marker

    marker = read_marker({MARKER: '{"root": "/r"}'})
    assert marker is not None
    assert marker.dumps() == Marker("/r", False).dumps()
