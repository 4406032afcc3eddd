"""Shell completion: the committed scripts are current, and installed versions complete."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from completions.generate import SHELLS, generate, path_for
from tests.conftest import REPO, require_tool
from tests.sdkfactory import OTHER_VERSION, VERSION, install_tree_into_cache

INSTALLED = sorted([VERSION, OTHER_VERSION])


@pytest.mark.parametrize("shell", SHELLS)
def test_committed_script_is_what_click_generates(shell: str) -> None:
    path = path_for(shell)
    assert path.read_text(encoding="utf-8") == generate(shell), (
        f"{path.name} is out of date: run python completions/generate.py"
    )


def test_generator_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    """--check fails on an edited copy and passes on the real folder."""
    copy = tmp_path / "completions"
    copy.mkdir()
    (copy / "generate.py").write_text(path_for("bash").with_name("generate.py").read_text())
    for shell in SHELLS:
        (copy / f"qnnctl.{shell}").write_text(path_for(shell).read_text())
    run = [sys.executable, str(copy / "generate.py"), "--check"]
    assert subprocess.run(run, cwd=REPO, capture_output=True).returncode == 0
    with (copy / "qnnctl.fish").open("a") as handle:
        handle.write("# edited by hand\n")
    stale = subprocess.run(run, cwd=REPO, capture_output=True, text=True)
    assert stale.returncode == 1
    assert "qnnctl.fish" in stale.stderr


def _complete(shell: str, words: str, cword: str,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """One completion request through click's protocol, as the generated scripts send it."""
    env = dict(os.environ if env is None else env,
               _QNNCTL_COMPLETE=f"{shell}_complete", COMP_WORDS=words, COMP_CWORD=cword)
    return subprocess.run([sys.executable, "-m", "qnnctl"], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def installed(cache_dir: Path) -> list[str]:
    for version in INSTALLED:
        install_tree_into_cache(cache_dir, version)
    return INSTALLED


@pytest.mark.parametrize("command", ["env", "uninstall"])
def test_installed_versions_complete_for_version_arguments(command: str, installed: list[str]) -> None:
    result = _complete("bash", f"qnnctl {command} ", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"plain,{v}" for v in installed]
    narrowed = _complete("bash", f"qnnctl {command} 2.37", "2")
    assert narrowed.stdout.splitlines() == [f"plain,{VERSION}"]


def test_zsh_and_fish_protocols(installed: list[str]) -> None:
    zsh = _complete("zsh", "qnnctl env ", "2")
    assert zsh.stdout.splitlines() == [line for v in installed for line in ("plain", v, "_")]
    # fish sends the word being completed as COMP_CWORD.
    fish = _complete("fish", "qnnctl env 2.34", "2.34")
    assert fish.stdout.splitlines() == [f"plain,{OTHER_VERSION}"]


def test_only_complete_sdks_are_offered(cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    # A folder without a manifest is an interrupted install, not an SDK.
    (cache_dir / "sdks" / OTHER_VERSION).mkdir(parents=True)
    result = _complete("bash", "qnnctl env ", "2")
    assert result.stdout.splitlines() == [f"plain,{VERSION}"]


def test_install_offers_installed_versions_first(installed: list[str]) -> None:
    result = _complete("bash", "qnnctl install ", "2")
    offered = [line.removeprefix("plain,") for line in result.stdout.splitlines()]
    assert offered[: len(installed)] == installed
    assert len(offered) > len(installed)
    assert len(set(offered)) == len(offered)


def test_a_broken_cache_setting_completes_nothing_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QNNCTL_CACHE_DIR", "")
    result = _complete("bash", "qnnctl env ", "2")
    assert result.returncode == 0
    assert result.stdout.strip() == ""
    assert result.stderr == ""


def _wrapper_path(tmp_path: Path) -> str:
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "qnnctl"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m qnnctl "$@"\n')
    script.chmod(0o755)
    return f"{folder}:/usr/bin:/bin"


def test_bash_script_completes_installed_versions(installed: list[str], tmp_path: Path) -> None:
    bash = require_tool("bash")
    script = (
        f"source {shlex.quote(str(path_for('bash')))}\n"
        "COMP_WORDS=(qnnctl env ''); COMP_CWORD=2; COMPREPLY=()\n"
        "_qnnctl_completion qnnctl\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
        "complete -p qnnctl\n"
    )
    env = dict(os.environ, PATH=_wrapper_path(tmp_path))
    result = subprocess.run([bash, "--norc", "--noprofile", "-c", script], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:-1] == installed
    assert lines[-1] == "complete -o nosort -F _qnnctl_completion qnnctl"


def test_fish_script_completes_installed_versions(installed: list[str], tmp_path: Path) -> None:
    fish = require_tool("fish")
    script = f"source {shlex.quote(str(path_for('fish')))}; complete -C 'qnnctl env 2.'"
    env = dict(os.environ, PATH=_wrapper_path(tmp_path))
    result = subprocess.run([fish, "--no-config", "-c", script], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == installed


def test_zsh_script_loads(tmp_path: Path) -> None:
    zsh = require_tool("zsh")
    script = (
        "autoload -Uz compinit && compinit -u -d \"$HOME/.zcompdump\"\n"
        f"source {shlex.quote(str(path_for('zsh')))}\n"
        "print -r -- $_comps[qnnctl]\n"
    )
    result = subprocess.run([zsh, "-f", "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "_qnnctl_completion"


# -- lower: script names; fish: whole descriptions ---------------------------------------------


@pytest.mark.parametrize(("words", "cword", "expected"), [
    ("qnnctl lower ", "2", ["file,"]),
    ("qnnctl lower exp", "2", ["file,exp"]),
    ("qnnctl lower --sdk 2.37 ", "4", ["file,"]),
    ("qnnctl lower export_model.py ", "3", ["file,"]),  # the pipeline's own arguments
    ("qnnctl lower -m ", "3", []),  # a module, which no file name names
])
def test_lower_completes_file_names(words: str, cword: str, expected: list[str]) -> None:
    result = _complete("bash", words, cword)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if line] == expected


def test_bash_script_has_bash_complete_file_names_for_lower(tmp_path: Path) -> None:
    bash = require_tool("bash")
    # compopt works only inside a completion that readline started: record what is asked of it.
    script = (
        f"source {shlex.quote(str(path_for('bash')))}\n"
        "compopt() { printf 'compopt %s %s\\n' \"$1\" \"$2\"; }\n"
        "COMP_WORDS=(qnnctl lower ex); COMP_CWORD=2; COMPREPLY=()\n"
        "_qnnctl_completion qnnctl\n"
        'printf "reply:%s\\n" "${#COMPREPLY[@]}"\n'
    )
    env = dict(os.environ, PATH=_wrapper_path(tmp_path))
    result = subprocess.run([bash, "--norc", "--noprofile", "-c", script], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["compopt -o default", "reply:0"]


def _fish_complete(line: str, path: str, cwd: Path) -> list[str]:
    fish = require_tool("fish")
    script = f"source {shlex.quote(str(path_for('fish')))}; complete -C {shlex.quote(line)}"
    env = dict(os.environ, PATH=path)
    result = subprocess.run([fish, "--no-config", "-c", script], env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_fish_script_completes_script_names_for_lower(tmp_path: Path) -> None:
    work = tmp_path / "project"
    work.mkdir()
    for name in ("export_model.py", "export,v2.py", "notes.txt"):
        (work / name).write_text("")
    path = _wrapper_path(tmp_path)
    assert sorted(_fish_complete("qnnctl lower exp", path, work)) == ["export,v2.py", "export_model.py"]
    assert "notes.txt" in _fish_complete("qnnctl lower export_model.py ", path, work)


def test_fish_descriptions_are_whole(tmp_path: Path) -> None:
    offered = dict(line.split("\t", 1) for line in _fish_complete("qnnctl ", _wrapper_path(tmp_path), tmp_path))
    assert offered["doctor"] == "Check host, SDK and environment; exit 1 on a failure."
