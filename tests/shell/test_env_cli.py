"""`qnnctl env` through the real entry point: selection, output formats, errors, purity."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_qnnctl
from tests.httpserver import FaultServer
from tests.sdkfactory import OTHER_VERSION, VERSION, build_sdk_tree, install_tree_into_cache
from tests.shell.test_startup import run_probe

LIB = "lib/x86_64-linux-clang"
BIN = "bin/x86_64-linux-clang"


def _env(**changes: str | None) -> dict[str, str]:
    env = os.environ.copy()
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def _json(*args: str, env: dict[str, str] | None = None) -> dict[str, str | None]:
    result = run_qnnctl("env", *args, "--shell", "json", env=env or _env())
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)  # exactly one JSON document
    assert isinstance(data, dict)
    return data


def test_json_is_one_object_with_the_final_values(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    data = _json(env=_env(LD_LIBRARY_PATH="/opt/user"))
    assert set(data) == {"QNN_SDK_ROOT", "LD_LIBRARY_PATH", "PATH", "QNNCTL_SDK"}
    assert data["QNN_SDK_ROOT"] == str(root)
    assert data["LD_LIBRARY_PATH"] == f"{root / LIB}:/opt/user"
    assert data["PATH"] == f"{root / BIN}:/usr/local/bin:/usr/bin:/bin"
    marker = data["QNNCTL_SDK"]
    assert marker is not None
    assert json.loads(marker)["root"] == str(root)


def test_an_sdk_without_tools_adds_nothing_to_path(cache_dir: Path) -> None:
    """An SDK of host libraries alone has no bin/ folder: PATH is left as it is (an entry that
    does not exist would only slow every command lookup), with PATH unset too."""
    root = install_tree_into_cache(cache_dir, VERSION)
    shutil.rmtree(root / "bin")
    data = _json()
    assert data["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert json.loads(str(data["QNNCTL_SDK"]))["added"].get("PATH", []) == []
    assert _json(env=_env(PATH=None))["PATH"] is None


def test_unset_ld_library_path_gets_no_empty_entry(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    data = _json(env=_env(LD_LIBRARY_PATH=None))
    assert data["LD_LIBRARY_PATH"] == str(root / LIB)


def test_dotenv_lines_are_literal(cache_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cache = tmp_path / "it's a $cache"
    root = install_tree_into_cache(cache, VERSION)
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(cache))
    result = run_qnnctl("env", "--shell", "dotenv", env=_env())
    assert result.returncode == 0, result.stderr
    pairs = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert pairs["QNN_SDK_ROOT"] == str(root)
    assert pairs["LD_LIBRARY_PATH"] == str(root / LIB)
    assert pairs["PATH"] == f"{root / BIN}:/usr/local/bin:/usr/bin:/bin"
    assert set(pairs) == {"QNN_SDK_ROOT", "LD_LIBRARY_PATH", "PATH", "QNNCTL_SDK"}


@pytest.mark.parametrize(("shell_var", "start"), [
    ("/usr/bin/fish", "set -gx QNN_SDK_ROOT "),
    ("/bin/bash", "export QNN_SDK_ROOT="),
    ("/usr/bin/zsh", "export QNN_SDK_ROOT="),
    ("/usr/bin/pwsh", "$env:QNN_SDK_ROOT = "),
    ("/opt/nu/bin/nu", "$env.QNN_SDK_ROOT = "),
    ("/bin/tcsh", "export QNN_SDK_ROOT="),
    (None, "export QNN_SDK_ROOT="),
])
def test_shell_is_detected_from_shell_variable(shell_var: str | None, start: str, cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    result = run_qnnctl("env", env=_env(SHELL=shell_var))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(start)


def test_empty_sdk_root_means_the_caller_is_in_charge(cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    result = run_qnnctl("env", "--shell", "bash", env=_env(QNN_SDK_ROOT=""))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert "QNN_SDK_ROOT is exported but empty" in result.stderr
    assert "''" not in result.stderr


def test_empty_sdk_root_still_gives_json_one_object(cache_dir: Path) -> None:
    """A program reading --shell json gets a document: the final values, QNN_SDK_ROOT left empty."""
    install_tree_into_cache(cache_dir, VERSION)
    assert _json(env=_env(QNN_SDK_ROOT="")) == {"QNN_SDK_ROOT": ""}
    for shell in ("sh", "fish", "dotenv"):
        result = run_qnnctl("env", "--shell", shell, env=_env(QNN_SDK_ROOT=""))
        assert (result.returncode, result.stdout) == (0, ""), result.stderr


def test_users_sdk_root_is_used_as_is(tmp_path: Path) -> None:
    mine = build_sdk_tree(tmp_path / "my sdk")
    given = f"{mine}/"  # exactly as the user wrote it, trailing slash included
    data = _json(env=_env(QNN_SDK_ROOT=given))
    assert data["QNN_SDK_ROOT"] == given
    assert data["LD_LIBRARY_PATH"] == str(mine / LIB)
    marker = data["QNNCTL_SDK"]
    assert marker is not None
    # --unset after it leaves the user's QNN_SDK_ROOT alone.
    undo = _json("--unset", env=_env(QNN_SDK_ROOT=given, QNNCTL_SDK=marker,
                                     LD_LIBRARY_PATH=data["LD_LIBRARY_PATH"], PATH=data["PATH"]))
    assert "QNN_SDK_ROOT" not in undo
    assert undo == {"LD_LIBRARY_PATH": None, "PATH": "/usr/local/bin:/usr/bin:/bin", "QNNCTL_SDK": None}


def test_users_sdk_root_gets_a_layout_check(tmp_path: Path) -> None:
    broken = tmp_path / "not an sdk"
    broken.mkdir()
    result = run_qnnctl("env", "--shell", "bash", env=_env(QNN_SDK_ROOT=str(broken)))
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"{LIB}/libQnnHtp.so" in result.stderr


@pytest.mark.parametrize(("how", "version"), [("argument", VERSION), ("pin", OTHER_VERSION), ("default", VERSION)])
def test_not_installed_names_the_install_command(how: str, version: str) -> None:
    args = [VERSION] if how == "argument" else []
    if how == "pin":
        Path(".qnn-version").write_text("2.34\n")
    result = run_qnnctl("env", *args, env=_env())
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"`qnnctl install {version}`" in result.stderr


def test_sdk_path_option(tmp_path: Path) -> None:
    mine = build_sdk_tree(tmp_path / "elsewhere")
    data = _json("--sdk", str(mine))
    assert data["QNN_SDK_ROOT"] == str(mine)
    missing = run_qnnctl("env", "--sdk", str(tmp_path / "nothing"))
    assert missing.returncode == 1
    assert missing.stdout == ""


@pytest.mark.parametrize("args", [[VERSION, "--sdk", "/x"], ["--unset", VERSION], ["--unset", "--sdk", "/x"],
                                  ["--shell", "tcsh"], ["--sdk", ""], ["--sdk", " "]])
def test_usage_errors(args: list[str], cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    result = run_qnnctl("env", *args)
    assert result.returncode == 2
    assert result.stdout == ""


def test_empty_sdk_option_is_not_the_current_folder(tmp_path: Path) -> None:
    """--sdk '' once checked the working directory; even an SDK there is not what was meant."""
    build_sdk_tree(Path.cwd())
    result = run_qnnctl("env", "--sdk", "", "--shell", "json")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "--sdk is empty" in result.stderr


def test_sdk_option_takes_a_version_as_the_other_commands_do(cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    by_argument = _json(VERSION)
    for given in (VERSION, ".".join(VERSION.split(".")[:2])):
        assert _json("--sdk", given) == by_argument
    missing = run_qnnctl("env", "--sdk", MISSING)
    assert (missing.returncode, missing.stdout) == (1, "")
    assert f"SDK {MISSING} is not installed" in missing.stderr


def test_sdk_option_relative_paths(tmp_path: Path) -> None:
    """A relative --sdk is a path even when it reads like a version (2.37.0.250724/...)."""
    mine = build_sdk_tree(Path.cwd() / VERSION / "qairt")
    for given in (f"{VERSION}/qairt", f"./{VERSION}/qairt"):
        assert _json("--sdk", given)["QNN_SDK_ROOT"] == str(mine)


def _snapshot(top: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under `top` with its type, size and modification time."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            found[str(path.relative_to(top))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


MISSING = "2.99.0.991231"


@pytest.mark.parametrize("args", [[VERSION], [], ["--unset"], [MISSING]],
                         ids=["version", "default", "unset", "missing"])
def test_env_is_a_pure_read(args: list[str], cache_dir: Path, tmp_path: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    before = _snapshot(tmp_path)
    probe = run_probe("env", *args, "--shell", "json", env=_env())
    assert probe.returncode == (1 if args == [MISSING] else 0), probe.stderr
    assert probe.started == []
    if args != [MISSING]:
        # Answered by the lean path; an error is the full command line's to report.
        heavy = ("filelock", "click", "qnnctl.cli", "qnnctl.install", "qnnctl.net.download", "qnnctl.net.ranged")
        assert not [m for m in probe.modules if m.startswith(heavy)]
    assert _snapshot(tmp_path) == before


def test_a_damaged_sdk_is_not_called_missing(mirror: FaultServer, cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    (root / LIB / "libQnnHtp.so").unlink()
    result = run_qnnctl("env", VERSION, "--shell", "json")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "not installed" not in result.stderr
    assert f"SDK {VERSION} in qnnctl's cache is damaged" in result.stderr
    assert f"{LIB}/libQnnHtp.so" in result.stderr
    assert f"`qnnctl install --force {VERSION}`" in result.stderr
    # The command the hint names does repair it.
    repaired = run_qnnctl("install", "--force", VERSION)
    assert repaired.returncode == 0, repaired.stderr
    assert _json(VERSION)["QNN_SDK_ROOT"] == str(root)


def test_sdk_option_naming_a_file(tmp_path: Path) -> None:
    archive = tmp_path / f"v{VERSION}.zip"
    archive.write_bytes(b"PK")
    result = run_qnnctl("env", "--sdk", str(archive))
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"--sdk {archive} is a file, not a folder" in result.stderr
    assert "missing the folder itself" not in result.stderr
    assert "qnnctl install --file" in result.stderr


def test_a_pin_with_a_byte_order_mark_is_read(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, OTHER_VERSION)
    install_tree_into_cache(cache_dir, VERSION)
    Path(".qnn-version").write_bytes(b"\xef\xbb\xbf" + OTHER_VERSION.encode() + b"\r\n")
    assert _json()["QNN_SDK_ROOT"] == str(root)


def test_a_mistyped_version_is_no_path(cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    result = run_qnnctl("env", f"{VERSION};rm -rf /")
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"'{VERSION};rm -rf /' is not an SDK version" in result.stderr


def test_env_after_replacing_an_empty_root_hands_the_sdk_back_to_the_caller(cache_dir: Path) -> None:
    """QNN_SDK_ROOT="" (the caller manages the SDK), then `qnnctl env VERSION` took over: a
    plain `qnnctl env` chooses afresh, finds the caller's choice, and undoes qnnctl's exports."""
    from qnnctl.shell.exports import apply

    install_tree_into_cache(cache_dir, VERSION)
    caller = {**os.environ, "QNN_SDK_ROOT": "", "LD_LIBRARY_PATH": "/opt/caller/lib"}
    taken = apply(caller, json.loads(run_qnnctl("env", VERSION, "--shell", "json", env=caller).stdout))
    assert taken["QNN_SDK_ROOT"] == str(cache_dir / "sdks" / VERSION)
    back = run_qnnctl("env", "--shell", "json", env=taken)
    assert back.returncode == 0, back.stderr
    restored = apply(taken, json.loads(back.stdout))
    assert restored["QNN_SDK_ROOT"] == ""
    assert restored["LD_LIBRARY_PATH"] == "/opt/caller/lib"
    assert "QNNCTL_SDK" not in restored
