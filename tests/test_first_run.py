"""What a newcomer meets first: versions as people type them, set-up behind a mirror, the shell
against the project's pin, and what `install` says comes next."""

from __future__ import annotations

import hashlib
import json
import os
import pty
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from qnnctl.errors import DownloadError
from qnnctl.install.pipeline import as_the_mirror_holds
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.mirrorindex import MirrorIndex
from qnnctl.sdk.select import BY_ARGUMENT, BY_DEFAULT, BY_PIN, Selection
from tests.conftest import read_terminal, run_qnnctl, run_qnnctl_on_a_terminal
from tests.httpserver import FaultServer
from tests.sdkfactory import VERSION, SdkSpec, build_archive, build_sdk_tree, install_tree_into_cache

# Releases newer than qnnctl's table of known ones: only what is installed or mirrored names them.
NEWER = "2.53.0.261201"
STORED = "2.54.0.270105"
MIRRORED = "2.55.0.270301"
GENUINE = "2.51.0.260929"  # the release the mirror of the report held


def shell_set_up_for(spec: str) -> dict[str, str]:
    """The environment after `eval "$(qnnctl env SPEC)"`."""
    proc = run_qnnctl("env", spec, "--shell", "json")
    assert proc.returncode == 0, proc.stderr
    return {**os.environ, **json.loads(proc.stdout)}


def serve(server: FaultServer, tmp_path: Path, *versions: str, index: bool = True) -> None:
    """The archives of `versions` on the server, laid out as `qnnctl mirror` does, with its index."""
    (tmp_path / "archives").mkdir(exist_ok=True)
    entries = {}
    for version in versions:
        data = build_archive(tmp_path / "archives", "zip", SdkSpec(version=version)).read_bytes()
        server.add(f"/{version}/v{version}.zip", data)
        entries[version] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "build_id": None,
                            "path": f"{version}/v{version}.zip", "added_at": "2026-12-01T00:00:00Z"}
    if index:
        server.add("/index.json", json.dumps({"schema": 1, "versions": entries}).encode())


def write_lock(version: str) -> None:
    """A qnnctl.lock here that pins `version` (by a digest no archive has: nothing is installed against it)."""
    Path("qnnctl.lock").write_text(f'schema = 1\n\n[sdk]\nversion = "{version}"\nsha256 = "{"0" * 64}"\nsize = 1\n')


def archive_requests(server: FaultServer) -> list[str]:
    return [r.path for r in server.requests if r.path.endswith(".zip")]


# -- 1, 2: versions as people type them ------------------------------------------------------------


def test_an_installed_release_newer_than_the_table_is_named_by_prefix(cache_dir: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root = install_tree_into_cache(cache_dir, NEWER)
    store = tmp_path / "store"
    stored = build_sdk_tree(store / STORED, SdkSpec(version=STORED))
    monkeypatch.setenv("QNNCTL_STORES", str(store))

    assert shell_set_up_for("2.53")["QNN_SDK_ROOT"] == str(root)
    assert shell_set_up_for("v2.54")["QNN_SDK_ROOT"] == str(stored)
    proc = run_qnnctl("install", "2.53")
    assert (proc.returncode, proc.stdout) == (0, f"{root}\n"), proc.stderr
    proc = run_qnnctl("which", "--sdk", "2.53", "libQnnHtp.so")
    assert (proc.returncode, proc.stdout) == (0, f"{root}/lib/x86_64-linux-clang/libQnnHtp.so\n"), proc.stderr
    proc = run_qnnctl("doctor", "--sdk", "2.54", "--json", "--offline")
    selection = next(c for c in json.loads(proc.stdout)["checks"] if c["id"] == "sdk.selection")
    assert selection["status"] == "ok", selection
    assert f"{STORED} at {stored}" in selection["detail"]
    proc = run_qnnctl("lower", "--dry-run", "--sdk", "2.53", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert str(root) in proc.stdout
    write_lock(NEWER)
    proc = run_qnnctl("lock", "--check", "2.53")
    # The prefix names the SDK installed; a lock of schema 1 cannot check it, which is said.
    assert proc.returncode == 1, proc.stderr
    assert f"SDK {NEWER} at {root} (qnnctl cache) cannot be checked against" in proc.stderr
    proc = run_qnnctl("use", "2.53")
    assert proc.returncode == 0, proc.stderr
    assert Path(".qnn-version").read_text() == f"{NEWER}\n"
    assert "not installed" not in proc.stderr
    # A prefix that nothing installed matches: the hint names what is installed, then the table.
    proc = run_qnnctl("env", "2.99")
    assert proc.returncode == 2
    assert f"installed: {NEWER}, {STORED} | known releases: " in proc.stderr


def test_a_prefix_names_what_the_mirror_lists(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    serve(server, tmp_path, MIRRORED)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    proc = run_qnnctl("install", "2.55")
    assert (proc.returncode, proc.stdout) == (0, f"{cache_dir}/sdks/{MIRRORED}\n"), proc.stderr
    assert archive_requests(server) == [f"/{MIRRORED}/v{MIRRORED}.zip"]
    # env never asks the mirror: it takes what is installed.
    server.requests.clear()
    assert shell_set_up_for("2.55")["QNN_SDK_ROOT"] == f"{cache_dir}/sdks/{MIRRORED}"
    assert server.requests == []


def test_the_name_qualcomm_gives_its_archives_is_a_version(mirror: FaultServer, cache_dir: Path) -> None:
    proc = run_qnnctl("install", f"v{VERSION}")
    assert (proc.returncode, proc.stdout) == (0, f"{cache_dir}/sdks/{VERSION}\n"), proc.stderr
    proc = run_qnnctl("uninstall", "v2.37")
    assert proc.returncode == 0, proc.stderr
    assert not (cache_dir / "sdks" / VERSION).exists()


# -- 3: behind a firewall, a mirror without qnnctl's default ----------------------------------------


def test_a_bare_install_takes_the_newest_the_mirror_holds(server: FaultServer, tmp_path: Path, cache_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's set-up (`export QNNCTL_MIRROR=...; qnnctl install`) with a mirror that holds
    only 2.51.0.260929, not qnnctl's default."""
    serve(server, tmp_path, "2.50.0.260828", GENUINE)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    proc = run_qnnctl("install", "-v")
    assert (proc.returncode, proc.stdout) == (0, f"{cache_dir}/sdks/{GENUINE}\n"), proc.stderr
    assert (f"the mirror's {server.base}/index.json lists no SDK {VERSION}, qnnctl's default; installing the "
            f"newest SDK it holds, {GENUINE}") in proc.stderr
    assert proc.stderr.count("chose SDK") == 1, proc.stderr
    assert archive_requests(server) == [f"/{GENUINE}/v{GENUINE}.zip"]


def test_a_pinned_version_the_mirror_lacks_is_refused_naming_what_it_holds(
        server: FaultServer, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    serve(server, tmp_path, GENUINE)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    Path(".qnn-version").write_text(f"{VERSION}\n")
    proc = run_qnnctl("install")
    assert proc.returncode == 3, proc.stderr
    assert f"lists no SDK {VERSION} (pinned in {Path.cwd()}/.qnn-version); it holds {GENUINE}" in proc.stderr
    assert f"`qnnctl install {GENUINE}` and pin it with `qnnctl use {GENUINE}`" in proc.stderr
    assert archive_requests(server) == []
    assert not (cache_dir / "sdks").exists()


UNMIRRORED = "2.52.0.261030"  # a full version newer than qnnctl's table, which the mirror lacks too


@pytest.mark.parametrize("spec", [UNMIRRORED, VERSION, "2.37"])
def test_a_version_typed_that_the_mirror_lacks_is_refused_before_anything_is_fetched(
        server: FaultServer, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    """As a pinned one is: named on the command line, full or a prefix, known to qnnctl or not."""
    serve(server, tmp_path, GENUINE)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    proc = run_qnnctl("install", spec)
    assert (proc.returncode, proc.stdout) == (3, ""), proc.stderr
    wanted = UNMIRRORED if spec == UNMIRRORED else VERSION
    assert proc.stderr == (
        f"qnnctl: error: the mirror's {server.base}/index.json lists no SDK {wanted} (given as {spec}); it holds "
        f"{GENUINE}; nothing was fetched\n"
        f"qnnctl: hint: add SDK {wanted} to the mirror's folder DIR (`qnnctl mirror DIR {wanted}`, or `qnnctl mirror "
        f"DIR --file ARCHIVE` from an archive you have), or use one it holds: `qnnctl install {GENUINE}`\n")
    assert archive_requests(server) == []
    assert not (cache_dir / "sdks").exists()
    # What it holds is installed as before.
    proc = run_qnnctl("install", GENUINE)
    assert (proc.returncode, proc.stdout) == (0, f"{cache_dir}/sdks/{GENUINE}\n"), proc.stderr


def test_a_dry_run_says_what_install_would_do_behind_a_mirror(
        server: FaultServer, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    serve(server, tmp_path, GENUINE)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    Path(".qnn-version").write_text(f"{VERSION}\n")
    refused = run_qnnctl("install")
    dry = run_qnnctl("lower", "--dry-run", "--", "true")
    assert (dry.returncode, dry.stdout) == (refused.returncode, ""), dry.stderr
    assert dry.stderr == refused.stderr
    assert f"lists no SDK {VERSION} (pinned in {Path.cwd()}/.qnn-version)" in dry.stderr
    # Without a pin, qnnctl's default gives way to the newest the mirror holds, in both.
    Path(".qnn-version").unlink()
    dry = run_qnnctl("lower", "--dry-run", "--", "true")
    assert dry.returncode == 0, dry.stderr
    assert (f"SDK {GENUINE} is not installed (the newest SDK that QNNCTL_MIRROR holds ({server.base}/index.json "
            f"lists no {VERSION}, qnnctl's default)): without --dry-run, qnnctl would first download it from "
            f"{server.base}/{GENUINE}/v{GENUINE}.zip") in dry.stderr
    assert f"export QNN_SDK_ROOT='{cache_dir}/sdks/{GENUINE}'" in dry.stdout
    assert archive_requests(server) == []
    done = run_qnnctl("install")
    assert (done.returncode, done.stdout) == (0, f"{cache_dir}/sdks/{GENUINE}\n"), done.stderr


def test_a_dry_run_on_a_terminal_says_its_note_once(tmp_path: Path, cache_dir: Path) -> None:
    """stdout and stderr on one terminal: the note is among the plan's comments, not said again."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "qnnctl", "lower", "--dry-run", "--", "true"],
                            stdout=terminal, stderr=terminal, stdin=subprocess.DEVNULL)
    os.close(terminal)
    seen = read_terminal(controller).decode()
    assert proc.wait(timeout=60) == 0, seen
    assert seen.count(f"SDK {VERSION} is not installed") == 1, seen
    assert f"# SDK {VERSION} is not installed" in seen
    piped = run_qnnctl("lower", "--dry-run", "--", "true")
    assert f"qnnctl: SDK {VERSION} is not installed" in piped.stderr  # where a script's $(...) leaves it seen
    assert f"# SDK {VERSION} is not installed" in piped.stdout


def test_a_mirror_without_an_index_is_used_as_before(mirror: FaultServer, cache_dir: Path) -> None:
    proc = run_qnnctl("install")
    assert (proc.returncode, proc.stdout) == (0, f"{cache_dir}/sdks/{VERSION}\n"), proc.stderr
    assert archive_requests(mirror) == [f"/{VERSION}/v{VERSION}.zip"]


def test_what_the_mirror_holds_is_its_full_versions_newest_by_number(server: FaultServer, cache_dir: Path) -> None:
    """In the tests' own process: the newest of 2.9 and 2.10 is 2.10 (not by the text), a key of the
    index that is no full version is no SDK the mirror holds, and a version asked for is refused
    naming each one it holds, with the pin's command only for a pinned version."""
    older, newer = "2.9.0.250101", "2.10.0.250201"
    entry = {"sha256": "0" * 64, "size": 1}
    server.add("/index.json", json.dumps({"schema": 1, "versions": {
        newer: entry, "latest": entry, older: entry}}).encode(), "application/json")
    index, cache, where = MirrorIndex(server.base), Cache(cache_dir), f"{server.base}/index.json"

    default = Selection(BY_DEFAULT, "qnnctl's default", version=VERSION)
    assert as_the_mirror_holds(default, index, cache, os.environ) == Selection(
        BY_DEFAULT, f"the newest SDK that QNNCTL_MIRROR holds ({where} lists no {VERSION}, qnnctl's default)",
        version=newer)
    hint = (f"add SDK {VERSION} to the mirror's folder DIR (`qnnctl mirror DIR {VERSION}`, or `qnnctl mirror DIR "
            f"--file ARCHIVE` from an archive you have), or use one it holds: `qnnctl install {newer}`")
    for reason, detail, more in ((BY_ARGUMENT, "given as 2.37", ""),
                                 (BY_PIN, f"pinned in {Path.cwd()}/.qnn-version",
                                  f" and pin it with `qnnctl use {newer}`")):
        with pytest.raises(DownloadError) as refused:
            as_the_mirror_holds(Selection(reason, detail, version=VERSION), index, cache, os.environ)
        assert (refused.value.message, refused.value.hint) == (
            f"the mirror's {where} lists no SDK {VERSION} ({detail}); it holds {older}, {newer}; nothing was fetched",
            hint + more)
    # Installed already: what the mirror lists does not matter.
    install_tree_into_cache(cache_dir, VERSION)
    pinned = Selection(BY_PIN, "pinned", version=VERSION)
    assert as_the_mirror_holds(pinned, index, cache, os.environ) is pinned


def test_a_mirror_that_holds_no_sdk_refuses_even_qnnctls_default(server: FaultServer, cache_dir: Path) -> None:
    """An index that lists no full version: there is no newest to take, and the hint has none to name."""
    server.add("/index.json", json.dumps({"schema": 1, "versions": {"latest": {"sha256": "0" * 64}}}).encode(),
               "application/json")
    where = f"{server.base}/index.json"
    with pytest.raises(DownloadError) as refused:
        as_the_mirror_holds(Selection(BY_DEFAULT, "qnnctl's default", version=VERSION), MirrorIndex(server.base),
                            Cache(cache_dir), os.environ)
    assert (refused.value.message, refused.value.hint) == (
        f"the mirror's {where} lists no SDK {VERSION} (qnnctl's default); it holds none; nothing was fetched",
        f"add SDK {VERSION} to the mirror's folder DIR (`qnnctl mirror DIR {VERSION}`, or `qnnctl mirror DIR "
        "--file ARCHIVE` from an archive you have), or use one it holds: `qnnctl install VERSION`")


# -- 4: doctor checks the network for the SDK it selected -------------------------------------------


def test_doctor_checks_the_archive_of_the_sdk_this_shell_was_set_up_for(
        server: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, NEWER)
    server.add(f"/{NEWER}/v{NEWER}.zip", b"PK\x05\x06" + b"\0" * 18)
    env = {**shell_set_up_for(NEWER), "QNNCTL_MIRROR": server.base}
    proc = run_qnnctl("doctor", "--json", env=env)
    network = next(c for c in json.loads(proc.stdout)["checks"] if c["id"] == "network")
    assert network["status"] == "ok", network
    assert f"answered HTTP 200 for {server.base}/{NEWER}/v{NEWER}.zip" in network["detail"]
    assert [r.path for r in server.requests] == [f"/{NEWER}/v{NEWER}.zip"]


# -- 5: the shell's SDK and the project's pin ------------------------------------------------------


def test_the_shell_and_the_pin_disagreeing_is_said_where_it_matters(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, NEWER)
    env = shell_set_up_for(NEWER)
    said = f"this shell was set up by `qnnctl env` for SDK {NEWER} ({root}), but {Path.cwd()}/.qnn-version " \
           f"pins SDK {VERSION}"
    switch = f'`qnnctl install {VERSION}`, then `eval "$(qnnctl env)"` switches this shell to SDK {VERSION}'

    proc = run_qnnctl("use", "2.37", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"SDK {VERSION} is not installed; `qnnctl install` installs it" in proc.stderr
    assert f"{said}; {switch}" in proc.stderr

    proc = run_qnnctl("doctor", "--json", "--offline", env=env)
    selection = next(c for c in json.loads(proc.stdout)["checks"] if c["id"] == "sdk.selection")
    assert selection["status"] == "warn", selection
    assert said in selection["detail"]
    assert selection["hint"] == switch

    proc = run_qnnctl("which", "libQnnHtp.so", env=env)
    assert proc.stdout == f"{root}/lib/x86_64-linux-clang/libQnnHtp.so\n"
    assert f"qnnctl: warning: {said}; {switch}" in proc.stderr

    write_lock(NEWER)
    proc = run_qnnctl("lock", "--check", env=env)
    assert proc.returncode == 1, proc.stderr  # a lock of schema 1 cannot check it, which is said too
    assert "cannot be checked against" in proc.stderr
    assert f"qnnctl: warning: {said}; {switch}; without this shell's SDK (as in CI), `qnnctl lock --check` checks " \
        "the lock against the pin" in proc.stderr
    Path("qnnctl.lock").unlink()

    proc = run_qnnctl("env", env=env)
    assert proc.returncode == 1
    assert f"SDK {VERSION} is not installed" in proc.stderr
    assert said in proc.stderr

    # Once the pinned SDK is there and the shell switched, nothing more is said.
    install_tree_into_cache(cache_dir, VERSION)
    env = shell_set_up_for(VERSION)
    for args in (("which", "libQnnHtp.so"), ("use", "2.37")):
        proc = run_qnnctl(*args, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "warning" not in proc.stderr


def test_use_says_when_the_lock_pins_another_version(cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    write_lock(NEWER)
    proc = run_qnnctl("use", VERSION)
    assert proc.returncode == 0, proc.stderr
    assert (f"{Path.cwd()}/qnnctl.lock pins SDK {NEWER}, not {VERSION}: `qnnctl lock --check` and `qnnctl install "
            f"--locked` fail until `qnnctl lock` writes it again for {VERSION}") in proc.stderr
    assert "not installed" not in proc.stderr


# -- 8: a mistyped mirror port ----------------------------------------------------------------------


def test_a_refused_connection_to_the_mirror_fails_at_once_naming_it(cache_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("QNNCTL_MIRROR", f"http://127.0.0.1:{port}/qairt")
    proc = run_qnnctl("install", VERSION)
    assert proc.returncode == 3, proc.stderr
    assert f"cannot reach the mirror: http://127.0.0.1:{port}/qairt/index.json: the connection was refused" \
        in proc.stderr
    assert "check the host and port of QNNCTL_MIRROR" in proc.stderr
    # One brief retry, of the index only, counted as what it is: the second attempt of two.
    assert proc.stderr.count("retrying") == 1, proc.stderr
    assert "retrying in 1.0s (attempt 2 of 2)" in proc.stderr
    assert "downloading" not in proc.stderr


# -- 9: what comes next ---------------------------------------------------------------------------


def test_install_on_a_terminal_says_what_comes_next(mirror: FaultServer, cache_dir: Path) -> None:
    code, out, seen = run_qnnctl_on_a_terminal("install")
    assert code == 0, seen
    assert out == f"{cache_dir}/sdks/{VERSION}\n"  # stdout is as it was, for scripts
    assert (b'qnnctl: next: `eval "$(qnnctl env)"` sets this shell up for SDK ' + VERSION.encode()
            + b"; `qnnctl doctor` then checks the setup") in seen
    # Piped, nobody reads it.
    proc = run_qnnctl("install")
    assert proc.returncode == 0, proc.stderr
    assert "next:" not in proc.stderr


def test_after_install_of_another_version_the_next_step_names_it(cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, NEWER)
    install_tree_into_cache(cache_dir, VERSION)
    code, _, seen = run_qnnctl_on_a_terminal("install", VERSION)  # `qnnctl env` would take the newest
    assert code == 0, seen
    assert f'`eval "$(qnnctl env {VERSION})"`'.encode() in seen


def test_the_main_help_starts_with_the_four_main_commands_and_gives_examples() -> None:
    proc = run_qnnctl("--help")
    assert proc.returncode == 0
    sections = [line for line in proc.stdout.splitlines() if line and not line.startswith(" ")]
    assert sections[2:] == ["Start here:", "Projects and fleets:", "Housekeeping:", "Models and phones:"], sections
    first = proc.stdout.split("Start here:\n", 1)[1].split("\n\n", 1)[0]
    assert [line.split()[0] for line in first.splitlines()] == ["install", "env", "doctor", "lower"]
    assert 'eval "$(qnnctl env)"' in proc.stdout.split("Examples:", 1)[1]
