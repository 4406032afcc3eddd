"""The error boundary: every failure is one line on stderr, a hint, and the contract's exit code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_qnnctl, run_qnnctl_on_a_terminal, with_default_sigint
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import VERSION, SdkSpec, build_archive, build_sdk_tree, install_tree_into_cache


def test_a_cache_that_cannot_be_created_is_one_line_and_a_hint(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    env = dict(os.environ, QNNCTL_CACHE_DIR=str(blocker / "cache"))
    for args in (("install", "--file", str(blocker)), ("cache", "clean"), ("install", VERSION)):
        result = run_qnnctl(*args, env=env)
        assert result.returncode == 1, result.stderr
        assert result.stdout == ""
        assert "Traceback" not in result.stderr
        assert "unexpected" not in result.stderr
        assert str(blocker) in result.stderr
        assert "QNNCTL_CACHE_DIR" in result.stderr


_INTERRUPTED_IN_IMPORT = """
import sys
from qnnctl.launch import main

stopped = sys.argv.pop(1)

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == stopped:
            raise KeyboardInterrupt  # the user's Ctrl-C, while the module is being imported
        return None

sys.meta_path.insert(0, CtrlC())
main()
"""


@pytest.mark.parametrize(("args", "module"), [
    (["doctor"], "qnnctl.cli"),
    (["lower", "--", "true"], "qnnctl.commands.leanlower"),
    (["env"], "qnnctl.commands.leanenv"),
])
def test_ctrl_c_before_a_command_has_started_is_said_as_after(args: list[str], module: str) -> None:
    """A Ctrl-C in the first tenths of a second, while the command line is still being imported,
    ended in a traceback of the import machinery."""
    proc = subprocess.run([sys.executable, "-c", _INTERRUPTED_IN_IMPORT, module, *args], capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        130, "", "qnnctl: interrupted; run the same command again to resume\n")


@pytest.mark.stdlib
def test_ctrl_c_during_a_download_says_how_to_resume(mirror: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    path = f"/{VERSION}/v{VERSION}.zip"
    # Three MiB of incompressible payload: the partial file is written in blocks of a mebibyte,
    # so it shows its first bytes with two still to come (about six seconds at this pace), not
    # only once the whole archive is in.
    archive = build_archive(tmp_path / "big", "zip", SdkSpec(extra_files={"docs/payload.bin": os.urandom(3 << 20)}))
    mirror.add(path, archive.read_bytes())
    mirror.fail(path, Fault.slow(16 << 10, 0.05))
    proc = subprocess.Popen(with_default_sigint([sys.executable, "-m", "qnnctl", "install"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    part = cache_dir / "downloads" / f"v{VERSION}.zip.part"
    while time.monotonic() < deadline and not (part.exists() and part.stat().st_size > 0):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert out == ""
    assert err.endswith("\nqnnctl: interrupted; run the same command again to resume\n"), err
    assert "\n\n" not in f"\n{err}", err  # no blank line, first or anywhere
    assert "stopped at" in err  # the progress line does not read like a finished download
    assert "Traceback" not in err
    assert part.exists()  # kept for the resume
    again = run_qnnctl("install")
    assert again.returncode == 0, again.stderr
    assert mirror.requests_for(path)[-1].headers.get("Range", "").startswith("bytes=")


@pytest.mark.stdlib
def test_a_reader_that_goes_away_is_not_an_error(cache_dir: Path) -> None:
    for version in ("2.34.0.250424", "2.36.1.250708", VERSION):
        install_tree_into_cache(cache_dir, version)
    proc = subprocess.Popen([sys.executable, "-m", "qnnctl", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()  # like `qnnctl list | true`
    _, err = proc.communicate(timeout=60)
    # click ends such a run quietly with exit 1; the point is that nothing is printed.
    assert err == b""


def test_force_without_a_version_never_reinstalls_the_users_sdk_root(mirror: FaultServer, cache_dir: Path,
                                                                      tmp_path: Path) -> None:
    """`install --force` with no VERSION while QNN_SDK_ROOT chooses the SDK: each place it can name."""
    from tests.sdkfactory import build_sdk_tree

    ours = install_tree_into_cache(cache_dir, VERSION)  # often `export QNN_SDK_ROOT=$(qnnctl install)`
    by_version = "; --force reinstalls an SDK of qnnctl's cache by VERSION"
    hint = "give the VERSION to reinstall (`qnnctl install --force VERSION`), or unset QNN_SDK_ROOT"
    expected = {
        ours: (f"QNN_SDK_ROOT names SDK {VERSION} in qnnctl's cache ({ours}); --force without a VERSION does not "
               "reinstall the SDK that QNN_SDK_ROOT names", f"run `qnnctl install --force {VERSION}` to reinstall it"),
        # In sdks/ but not named as a version: no SDK of the cache.
        build_sdk_tree(cache_dir / "sdks" / f"{VERSION}.old"):
            (f"QNN_SDK_ROOT names {cache_dir / 'sdks' / f'{VERSION}.old'}, inside qnnctl's cache, not one of its "
             f"SDKs{by_version}", hint),
        # Named as a version, in the cache but not in sdks/.
        build_sdk_tree(cache_dir / "unpacked" / VERSION):
            (f"QNN_SDK_ROOT names {cache_dir / 'unpacked' / VERSION}, inside qnnctl's cache, not one of its "
             f"SDKs{by_version}", hint),
        # Named as a version, outside the cache.
        build_sdk_tree(tmp_path / "vendor" / VERSION):
            (f"QNN_SDK_ROOT names {tmp_path / 'vendor' / VERSION}, outside qnnctl's cache{by_version}", hint),
    }
    for root, (message, hint_line) in expected.items():
        result = run_qnnctl("install", "--force", env=dict(os.environ, QNN_SDK_ROOT=str(root)))
        assert result.returncode == 2, result.stderr
        assert result.stdout == ""
        assert result.stderr == f"qnnctl: error: {message}\nqnnctl: hint: {hint_line}\n"
    assert mirror.requests == []


def test_a_named_file_install_of_an_installed_version_reads_no_archive(cache_dir: Path, tmp_path: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    not_an_archive = tmp_path / "v2.37.0.250724.zip"
    not_an_archive.write_bytes(b"not a zip at all")
    result = run_qnnctl("install", VERSION, "--file", str(not_an_archive))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{root}\n"
    forced = run_qnnctl("install", VERSION, "--file", str(not_an_archive), "--force")
    assert forced.returncode == 4, forced.stderr  # --force does read it, and refuses it


# -- messages that say what is actually wrong --------------------------------------------------


def _usage_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "unexpected" not in result.stderr
    for word in words:
        assert word in result.stderr


def test_a_mistyped_version_is_not_called_a_path(mirror: FaultServer) -> None:
    spec = f"{VERSION};rm -rf /"
    _usage_error(run_qnnctl("install", spec), f"{spec!r} is not an SDK version")
    _usage_error(run_qnnctl("lower", "--sdk", spec, "--dry-run", "--", "true"), f"{spec!r} is not an SDK version")
    assert mirror.requests == []
    # A path that does exist is still told apart from a version.
    Path(VERSION).mkdir()
    refused = run_qnnctl("install", f"{VERSION}/")
    _usage_error(refused)
    assert refused.stderr == (f"qnnctl: error: '{VERSION}/' is a path; install takes a VERSION\n"
                              "qnnctl: hint: use `qnnctl install --file ARCHIVE` for an archive on disk\n")


_NOT_A_URL = "is not a valid URL: its host or port cannot be read"
_BRACKETS = "check the brackets around an IPv6 address and the port number"
_SCHEMES = ": qnnctl downloads over https or http (or a file: URL), not"
_ON_DISK = "an archive on disk is installed with `qnnctl install --file ARCHIVE`"


@pytest.mark.parametrize(("url", "told", "hint"), [
    ("http://[::1/v2.37.0.250724.zip", f"http://[::1/v2.37.0.250724.zip {_NOT_A_URL}", _BRACKETS),
    ("http://127.0.0.1:port/v2.37.0.250724.zip", f"http://127.0.0.1:port/v2.37.0.250724.zip {_NOT_A_URL}", _BRACKETS),
    ("ftp://127.0.0.1/v2.37.0.250724.zip", f"ftp://127.0.0.1/v2.37.0.250724.zip{_SCHEMES} ftp:", _ON_DISK),
    ("https:///v2.37.0.250724.zip", "https:///v2.37.0.250724.zip names no host",
     "URLs look like https://host/path/v2.37.0.250724.zip"),
    ("v2.37.0.250724.zip", f"v2.37.0.250724.zip{_SCHEMES} a URL without a scheme", _ON_DISK),
    ("file://elsewhere/v2.37.0.250724.zip",
     "file://elsewhere/v2.37.0.250724.zip names a file on another host (elsewhere)",
     "a file: URL names a file on this machine: file:///path/to/v2.37.0.250724.zip"),
    # Shown redacted: the password and the query's token are not printed.
    ("http://user:S3cr3t@[::1/v2.37.0.250724.zip?token=SIGNED",
     f"http://***@[::1/v2.37.0.250724.zip?token=*** {_NOT_A_URL}", _BRACKETS),
    ("http://127.0.0.1/v2.37\t.zip", "'http://127.0.0.1/v2.37\\t.zip' holds a control character (a newline or tab)",
     "remove it: a URL is one line of printable text"),
], ids=["ipv6", "port", "ftp", "no-host", "no-scheme", "file-elsewhere", "secret", "tab"])
def test_a_url_no_download_can_start_from_is_a_usage_error(url: str, told: str, hint: str, server: FaultServer,
                                                            cache_dir: Path) -> None:
    result = run_qnnctl("install", "--url", url)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"qnnctl: error: --url {told}\nqnnctl: hint: {hint}\n"
    assert not cache_dir.exists()
    assert server.requests == []


def test_a_mirror_no_download_can_start_from_is_a_usage_error(cache_dir: Path) -> None:
    env = dict(os.environ, QNNCTL_MIRROR="http://[::1/qairt")
    _usage_error(run_qnnctl("install", VERSION, env=env),
                 f"qnnctl: error: QNNCTL_MIRROR http://[::1/qairt {_NOT_A_URL}\n")
    env["QNNCTL_MIRROR"] = "file:///srv/qairt"
    # A mirror is fetched from: file: URLs are for --url alone.
    _usage_error(run_qnnctl("install", VERSION, env=env),
                 "qnnctl: error: QNNCTL_MIRROR file:///srv/qairt: qnnctl downloads over https or http, not file:\n")
    assert not cache_dir.exists()


@pytest.mark.parametrize("host", ["", "localhost"])
def test_a_file_url_installs_the_archive_it_names(host: str, tmp_path: Path, cache_dir: Path) -> None:
    from tests.sdkfactory import build_archive

    archive = build_archive(tmp_path, "zip")
    # file:///path and file://localhost/path both name a file on this machine (RFC 8089).
    result = run_qnnctl("install", "--url", archive.as_uri().replace("file://", f"file://{host}", 1))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{cache_dir / 'sdks' / VERSION}\n"


@pytest.mark.parametrize("name", ["a:b", "new\nline"], ids=["colon", "newline"])
def test_a_cache_path_no_path_list_can_hold_is_refused_before_any_download(
        name: str, mirror: FaultServer, tmp_path: Path) -> None:
    cache = tmp_path / name / "cache"
    env = dict(os.environ, QNNCTL_CACHE_DIR=str(cache))
    for args in (["install"], ["install", VERSION], ["lower", "--", "true"], ["lower", "--dry-run", "--", "true"]):
        _usage_error(run_qnnctl(*args, env=env), "QNNCTL_CACHE_DIR", "could not be put on LD_LIBRARY_PATH")
    assert mirror.requests == []
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize("args", [["--sdk"], ["--sdk", "--", "true"], ["--python"]])
def test_lower_option_without_its_value(args: list[str]) -> None:
    _usage_error(run_qnnctl("lower", *args), f"{args[0]} needs a value")


# -- -v and -q -----------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_is_debug_before_or_after_the_command(where: str) -> None:
    args = ["-v", "doctor", "--offline"] if where == "before" else ["doctor", "--offline", "-v"]
    result = run_qnnctl(*args)
    assert "qnnctl: checking host" in result.stderr
    assert "Usage:" not in result.stderr
    plain = run_qnnctl("doctor", "--offline")
    assert "checking host" not in plain.stderr
    assert plain.returncode == result.returncode


@pytest.mark.parametrize("args", [["install", "-v", "--url", "http://["], ["-v", "install", "-q", "-q", "-v", "--url",
                                                                             "http://["], ["env", "-v", "--sdk", ""]])
def test_verbosity_options_are_accepted_after_any_command(args: list[str]) -> None:
    result = run_qnnctl(*args)
    assert result.returncode == 2
    assert "no such option" not in result.stderr.lower()
    assert "qnnctl: error:" in result.stderr


def test_quiet_levels_match_the_help(cache_dir: Path) -> None:
    """-q: warnings and errors; -qq: errors only; given before the command or after it."""
    from filelock import FileLock

    (cache_dir / "tmp" / f"{VERSION}.left-behind").mkdir(parents=True)
    (cache_dir / "locks").mkdir()
    with FileLock(str(cache_dir / "locks" / f"{VERSION}.lock")):
        def levels(*args: str) -> tuple[bool, bool]:
            result = run_qnnctl(*args)
            assert result.returncode == 0, result.stderr
            return "qnnctl: warning:" in result.stderr, "nothing to clean" in result.stderr
        assert levels("cache", "clean") == (True, False)
        for quiet in (["-q", "cache", "clean"], ["cache", "clean", "-q"], ["cache", "-q", "clean"]):
            assert levels(*quiet) == (True, False)
        for errors_only in (["-qq", "cache", "clean"], ["cache", "clean", "-qq"], ["-q", "cache", "clean", "-q"],
                            ["cache", "clean", "-qqqq"]):
            assert levels(*errors_only) == (False, False)
    assert levels("cache", "clean", "-q") == (False, False)  # info is gone, and there is no warning left
    assert levels("cache", "clean") == (False, True)


def test_help_describes_the_levels() -> None:
    def words(*args: str) -> str:
        return " ".join(run_qnnctl(*args).stdout.split())  # as wrapped for any terminal width

    top = words("--help")
    assert "-vv" not in top
    assert "-v, --verbose Debug detail on stderr" in top
    assert "-q, --quiet Less on stderr: warnings and errors only (-qq: errors only)" in top
    assert "-v, --verbose Debug detail on stderr" in words("install", "--help")


def test_an_unexpected_error_shows_no_secret_of_a_url_in_its_message(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from qnnctl import cli
    from qnnctl.commands import env

    def boom(*args: object) -> None:
        raise RuntimeError("fetching https://user:S3cr3t@mirror.example/v.zip?token=SIGNED broke")

    monkeypatch.setattr(env, "installed_sdks", boom)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["list"])
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert "unexpected error: RuntimeError" in err
    assert "mirror.example" in err
    assert "S3cr3t" not in err
    assert "SIGNED" not in err


NO_SUCH_USER = "~qnnctl-no-such-user"


@pytest.mark.parametrize(("args", "variables", "code", "said"), [
    (("env", "--sdk", f"{NO_SUCH_USER}/sdk"), {}, 1, f"--sdk {{cwd}}/{NO_SUCH_USER}/sdk does not exist"),
    (("env",), {"QNN_SDK_ROOT": f"{NO_SUCH_USER}/sdk"}, 1,
     f"QNN_SDK_ROOT {{cwd}}/{NO_SUCH_USER}/sdk does not exist"),
    (("link", f"{NO_SUCH_USER}/sdk"), {}, 1, f"the folder {{cwd}}/{NO_SUCH_USER}/sdk does not exist"),
    (("install", VERSION, "--file", f"{NO_SUCH_USER}/a.zip"), {}, 2, f"{{cwd}}/{NO_SUCH_USER}/a.zip is not a file"),
    (("list",), {"QNNCTL_CACHE_DIR": f"{NO_SUCH_USER}/cache"}, 0, "no SDK installed"),
    (("list",), {"QNNCTL_STORES": f"{NO_SUCH_USER}/store"}, 0, "no SDK installed"),
], ids=["env --sdk", "QNN_SDK_ROOT", "link", "install --file", "QNNCTL_CACHE_DIR", "QNNCTL_STORES"])
def test_a_path_under_the_home_of_no_such_user_is_a_path_that_is_not_there(
        args: tuple[str, ...], variables: dict[str, str], code: int, said: str, tmp_path: Path,
        cache_dir: Path) -> None:
    """`~user` of a user this machine does not know stays as written, as a shell leaves it: the
    path is then one that is not there (Python's Path.expanduser raises instead)."""
    result = run_qnnctl(*args, env={**os.environ, **variables}, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (code, ""), result.stderr
    assert said.format(cwd=tmp_path) in result.stderr
    assert "unexpected" not in result.stderr
    assert not (tmp_path / NO_SUCH_USER).exists()


# -- one style for errors, warnings and hints ----------------------------------------------------

RED, YELLOW, CYAN, RESET = "\x1b[1;31m", "\x1b[33m", "\x1b[36m", "\x1b[0m"


def test_clicks_own_usage_errors_read_as_qnnctls() -> None:
    """`qnnctl instal`: `qnnctl: error:` and `qnnctl: hint:` (click's suggestion, the usage, the
    help), not click's `Error: No such command` under a usage block."""
    result = run_qnnctl("instal")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "qnnctl: error: no such command 'instal'\n"
        "qnnctl: hint: did you mean 'install' (or 'uninstall', 'inspect')? usage: qnnctl [OPTIONS] COMMAND "
        "[ARGS]...; `qnnctl --help` says more\n")
    shell = run_qnnctl("env", "--shel")
    assert "qnnctl: hint: did you mean '--shell' (or '--help', '--unset')? " in shell.stderr  # closest first
    option = run_qnnctl("install", "--forc")
    assert option.returncode == 2
    assert option.stderr == ("qnnctl: error: no such option '--forc'\n"
                             "qnnctl: hint: did you mean '--force'? usage: qnnctl install [OPTIONS] [VERSION]; "
                             "`qnnctl install --help` says more\n")
    missing = run_qnnctl("link")
    assert (missing.returncode, missing.stderr) == (2, "qnnctl: error: missing argument 'PATH'\nqnnctl: hint: usage: "
                                                       "qnnctl link [OPTIONS] PATH; `qnnctl link --help` says more\n")


def test_install_help_names_every_form_of_version() -> None:
    """Installed and mirrored releases and a leading v work, not only known prefixes."""
    text = " ".join(run_qnnctl("install", "--help").stdout.split())
    assert ("VERSION is a full version (2.37.0.250724, or v2.37.0.250724 as the archives are named) or a prefix "
            "(2.37): the newest match installed, else on QNNCTL_MIRROR, else known.") in text


@pytest.mark.parametrize("group", [[], ["device"], ["cache"]])
def test_a_bare_group_prints_its_help_on_stdout(group: list[str]) -> None:
    """Bare `qnnctl` (the first thing many type) and bare groups: their help, asked for, not an error."""
    result = run_qnnctl(*group)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == run_qnnctl(*group, "--help").stdout
    assert result.stdout.startswith(f"Usage: {' '.join(['qnnctl', *group])} [OPTIONS] COMMAND [ARGS]...\n")


def test_errors_warnings_and_hints_are_coloured_on_a_terminal_only(cache_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, seen = run_qnnctl_on_a_terminal("instal")
    text = seen.decode().replace("\r\n", "\n")
    assert (code, out) == (2, "")
    assert text.startswith(f"qnnctl: {RED}error:{RESET} no such command 'instal'\n"
                           f"qnnctl: {CYAN}hint:{RESET} did "), text
    # A warning (a link of a version qnnctl's cache holds too) and a QnnctlError's error and hint.
    install_tree_into_cache(cache_dir, VERSION)
    folder = build_sdk_tree(tmp_path / "unpacked", SdkSpec(version=VERSION))
    code, _, seen = run_qnnctl_on_a_terminal("link", str(folder), "--version", VERSION)
    assert code == 0
    assert f"qnnctl: {YELLOW}warning:{RESET} SDK {VERSION} is also in qnnctl's cache" in seen.decode()
    code, _, seen = run_qnnctl_on_a_terminal("uninstall", "2.99")
    assert code == 1
    assert f"qnnctl: {RED}error:{RESET} " in seen.decode()
    assert f"qnnctl: {CYAN}hint:{RESET} " in seen.decode()
    # NO_COLOR set to anything, or stderr no terminal: the same words, no colour.
    monkeypatch.setenv("NO_COLOR", "1")
    code, _, seen = run_qnnctl_on_a_terminal("instal")
    assert code == 2
    assert seen.decode().startswith("qnnctl: error: no such command 'instal'\r\nqnnctl: hint: did you mean")
    assert b"\x1b" not in seen
    monkeypatch.delenv("NO_COLOR")
    piped = run_qnnctl("link", str(folder), "--version", VERSION)
    assert "qnnctl: warning: SDK" in piped.stderr
    assert "\x1b" not in piped.stderr


# -- where the cache is ----------------------------------------------------------------------------


def test_an_empty_or_relative_home_is_refused_for_the_default_cache(tmp_path: Path) -> None:
    """HOME="" would put the cache at /.cache/qnnctl: refused (exit 2) before anything is made."""
    env = {k: v for k, v in os.environ.items() if k not in ("QNNCTL_CACHE_DIR", "XDG_CACHE_HOME")}
    for home, what in (("", "empty"), ("somewhere", "relative ('somewhere')")):
        result = run_qnnctl("install", env={**env, "HOME": home})
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        where = "/.cache/qnnctl" if not home else str(Path.cwd() / home / ".cache" / "qnnctl")
        assert result.stderr == (
            f"qnnctl: error: HOME is {what}: the default cache, ~/.cache/qnnctl, would be {where}\n"
            "qnnctl: hint: set HOME to your home folder, or point QNNCTL_CACHE_DIR (or XDG_CACHE_HOME) at a folder\n")
    assert not (Path.cwd() / "somewhere").exists()
    # XDG_CACHE_HOME, when absolute, or QNNCTL_CACHE_DIR takes its place; a relative
    # XDG_CACHE_HOME is ignored, as its specification says.
    chosen = run_qnnctl("list", env={**env, "HOME": "", "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert (chosen.returncode, chosen.stderr) == (0, "qnnctl: no SDK installed; run `qnnctl install`\n")
    users_home = tmp_path / "home"
    install_tree_into_cache(users_home / ".cache" / "qnnctl", VERSION)
    relative = run_qnnctl("list", "--json", env={**env, "HOME": str(users_home), "XDG_CACHE_HOME": "xdg"})
    assert relative.returncode == 0, relative.stderr
    assert [row["version"] for row in json.loads(relative.stdout)["sdks"]] == [VERSION]


def test_a_relative_cache_dir_is_said_once_and_taken_from_the_current_folder(tmp_path: Path) -> None:
    install_tree_into_cache(Path.cwd() / "rel" / "cache", VERSION)
    result = run_qnnctl("env", "--shell", "json", env={**os.environ, "QNNCTL_CACHE_DIR": "rel/cache"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["QNN_SDK_ROOT"] == str(Path.cwd() / "rel" / "cache" / "sdks" / VERSION)
    assert result.stderr == (
        f"qnnctl: warning: QNNCTL_CACHE_DIR=rel/cache is relative: the cache is {Path.cwd() / 'rel' / 'cache'}, "
        "taken from the current folder; run from another folder, qnnctl would use another cache (an absolute "
        "path avoids that)\n")
    absolute = run_qnnctl("env", "--shell", "json",
                          env={**os.environ, "QNNCTL_CACHE_DIR": str(Path.cwd() / "rel" / "cache")})
    assert (absolute.returncode, absolute.stderr) == (0, "")


def test_every_command_module_is_in_the_command_table() -> None:
    """qnnctl.cli.COMMANDS is the one list of commands: each entry names a click command of that
    name in qnnctl.commands, and each module there (but the shared ones, and the lean `env` and
    `lower` that qnnctl.launch loads instead of the command line) defines some entry."""
    import importlib

    import click

    from qnnctl import cli

    for name, (module, attribute) in cli.COMMANDS.items():
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        assert command.name == name or (name, command.name) == ("list", "list")
    folder = Path(cli.__file__).parent / "commands"
    modules = {f"qnnctl.commands.{p.stem}" for p in folder.glob("*.py")} - {
        "qnnctl.commands.__init__", "qnnctl.commands.common", "qnnctl.commands.stderr", "qnnctl.commands.leanenv",
        "qnnctl.commands.leanlower"}
    assert modules == {module for module, _ in cli.COMMANDS.values()}


@pytest.mark.parametrize(("argv", "loaded"), [
    (["--version"], set()),
    (["--help"], "all"),
    (["list"], {"qnnctl.commands.env"}),
    (["use", "--help"], {"qnnctl.commands.projects"}),
    (["cache", "clean", "--help"], {"qnnctl.commands.housekeeping"}),
])
def test_a_command_loads_its_own_module_only(argv: list[str], loaded: set[str] | str) -> None:
    """The command line imports a command's module when that command runs: `qnnctl list` pays
    for neither requests nor the doctor's checks; --help lists (and so loads) every command."""
    code = ("import json, sys\nfrom qnnctl.cli import main\ntry:\n    main(sys.argv[1:])\nfinally:\n"
            "    print(json.dumps(sorted(sys.modules)), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    modules = set(json.loads(proc.stderr.splitlines()[-1]))
    commands = {m for m in modules if m.startswith("qnnctl.commands.")} - {"qnnctl.commands.common",
                                                                           "qnnctl.commands.stderr"}
    from qnnctl import cli

    assert commands == ({module for module, _ in cli.COMMANDS.values()} if loaded == "all" else loaded)
    if argv in (["--version"], ["list"]):
        assert not {"requests", "rich", "elftools", "qnnctl.doctor.diagnose"} & modules
