"""Holds: an SDK that a running pipeline (or a Python that called setup_sdk()) uses is never
removed or replaced. Real processes of the entry point, real shells as pipelines, a real
loopback server for reinstalls; each pipeline waits for the test to let it go on, so that
nothing depends on how long anything takes."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest

from qnnctl.errors import QnnctlError
from qnnctl.sdk.cache import Cache, read_manifest
from qnnctl.sdk.holds import exclusive, held_by, hold_sdk, holders_of
from tests.conftest import run_qnnctl
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import OTHER_VERSION, VERSION, build_sdk_tree, install_tree_into_cache

THIRD = "2.31.0.250130"
PATH = f"/{VERSION}/v{VERSION}.zip"
HTP = "lib/x86_64-linux-clang/libQnnHtp.so"
# The pipeline of the issue: it says it has started, waits until the test lets it go on, then
# lists a library of its SDK (the late load that a removed SDK would fail).
PIPELINE = ('echo started > "$1"; while [ ! -e "$2" ]; do sleep 0.05; done; '
            f'ls "$QNN_SDK_ROOT/{HTP}"')


def _wait_for(what: str, done: Path, proc: subprocess.Popen[str]) -> None:
    """Until `done` exists; a process that ends first fails the test with what it said."""
    deadline = time.monotonic() + 60
    while not done.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"{what} ended ({proc.returncode}) before it started: {out}{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{what} did not start within a minute")
        time.sleep(0.02)


class Pipeline:
    """`qnnctl lower --sdk VERSION -- sh -c PIPELINE`, started and waiting to be let go on."""

    def __init__(self, tmp_path: Path, version: str, name: str = "pipeline",
                 env: dict[str, str] | None = None) -> None:
        self.started = tmp_path / f"{name}.started"
        self.go = tmp_path / f"{name}.go"
        sdk = ["--sdk", version] if version else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qnnctl", "lower", *sdk, "--", "sh", "-c", PIPELINE, "sh",
             str(self.started), str(self.go)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        _wait_for("the pipeline", self.started, self.proc)

    @property
    def pid(self) -> int:
        return self.proc.pid  # qnnctl lower replaced itself with the pipeline: the same process

    def finish(self) -> tuple[int, str, str]:
        self.go.touch()
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, out, err


@contextmanager
def pipeline(tmp_path: Path, version: str = VERSION, name: str = "pipeline",
             env: dict[str, str] | None = None) -> Iterator[Pipeline]:
    running = Pipeline(tmp_path, version, name, env)
    try:
        yield running
    finally:
        if running.proc.poll() is None:
            running.go.touch()
            try:
                running.proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                running.proc.kill()
                running.proc.communicate()


def _in_use(text: str, pid: int, version: str, root: Path, level: str = "error") -> bool:
    """Whether a line of `text` says SDK `version` is in use, naming the pipeline's shell `pid`
    among its holders (listed by PID: a `sleep` the shell runs holds the SDK too, and after the
    PIDs wrap around it may come first)."""
    return any(line.startswith(f"qnnctl: {level}: SDK {version} ({root}) is in use by PID ")
               and f"PID {pid} (sh -c " in line for line in text.splitlines())


def test_uninstall_leaves_the_sdk_of_a_running_pipeline_and_removes_it_once_it_ended(
        cache_dir: Path, tmp_path: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    with pipeline(tmp_path) as running:
        refused = run_qnnctl("uninstall", VERSION)
        assert refused.returncode == 1, refused.stderr
        assert _in_use(refused.stderr.splitlines()[0], running.pid, VERSION, root), refused.stderr
        assert f"; it was not removed\nqnnctl: hint: run it again once that process has ended, or `qnnctl " \
               f"uninstall --wait {VERSION}` to wait for it\n" in refused.stderr
        assert "removed" not in refused.stderr.split("; it was not removed")[1]
        assert (root / ".qnnctl.json").is_file()
        code, out, err = running.finish()
    assert (code, out) == (0, f"{root / HTP}\n"), err
    removed = run_qnnctl("uninstall", VERSION)
    assert removed.returncode == 0, removed.stderr
    assert f"removed SDK {VERSION} (" in removed.stderr
    assert f") from {root}" in removed.stderr
    assert not root.exists()
    assert held_by(Cache(cache_dir), VERSION) == []


def test_list_shows_the_processes_that_use_an_sdk(cache_dir: Path, tmp_path: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    with pipeline(tmp_path) as running:
        text = run_qnnctl("list")
        rows = {row["version"]: row for row in json.loads(run_qnnctl("list", "--json").stdout)["sdks"]}
        running.finish()
    line = next(line for line in text.stdout.splitlines() if line[3:].startswith(VERSION))
    assert f"{root}  " in line
    assert "in use by PID " in line  # the holders by PID: the shell, and perhaps a `sleep` it runs
    assert f"PID {running.pid} (sh -c 'echo started > " in line
    other = next(line for line in text.stdout.splitlines() if line[3:].startswith(OTHER_VERSION))
    assert "in use" not in other
    pids = {holder["pid"]: holder["command"] for holder in rows[VERSION]["held_by"]}
    assert pids[running.pid].startswith("sh -c 'echo started > ")
    assert rows[OTHER_VERSION]["held_by"] == []
    after = json.loads(run_qnnctl("list", "--json").stdout)["sdks"]
    assert [row["held_by"] for row in after] == [[], []]


@pytest.mark.stdlib
def test_a_holder_killed_with_sigkill_holds_nothing(cache_dir: Path, tmp_path: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    started = tmp_path / "started"
    proc = subprocess.Popen([sys.executable, "-m", "qnnctl", "lower", "--sdk", VERSION, "--", "sh", "-c",
                             'echo started > "$1"; exec sleep 600', "sh", str(started)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for("the pipeline", started, proc)
        assert [holder.pid for holder in held_by(Cache(cache_dir), VERSION)] == [proc.pid]
        assert run_qnnctl("uninstall", VERSION).returncode == 1
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert held_by(Cache(cache_dir), VERSION) == []
    removed = run_qnnctl("uninstall", VERSION)
    assert removed.returncode == 0, removed.stderr
    assert not root.exists()


def test_uninstall_except_removes_the_free_sdks_and_leaves_the_held_one(cache_dir: Path, tmp_path: Path) -> None:
    roots = {version: install_tree_into_cache(cache_dir, version) for version in (VERSION, OTHER_VERSION, THIRD)}
    with pipeline(tmp_path, OTHER_VERSION) as running:
        pruned = run_qnnctl("uninstall", "--except", VERSION)
        code, _, err = running.finish()
    assert code == 0, err
    assert pruned.returncode == 1, pruned.stderr
    assert f"removed SDK {THIRD}" in pruned.stderr
    assert f"kept {VERSION}" in pruned.stderr
    assert "removed 1 SDK, freed" in pruned.stderr
    assert _in_use(pruned.stderr, running.pid, OTHER_VERSION, roots[OTHER_VERSION]), pruned.stderr
    assert sorted(p.name for p in (cache_dir / "sdks").iterdir()) == sorted([VERSION, OTHER_VERSION])
    assert (roots[OTHER_VERSION] / ".qnnctl.json").is_file()


def test_uninstall_of_several_names_each_sdk_in_use_and_removes_the_rest(cache_dir: Path, tmp_path: Path) -> None:
    roots = {version: install_tree_into_cache(cache_dir, version) for version in (VERSION, OTHER_VERSION, THIRD)}
    with pipeline(tmp_path, VERSION, "first") as first, pipeline(tmp_path, OTHER_VERSION, "second") as second:
        named = run_qnnctl("uninstall", VERSION, OTHER_VERSION, THIRD)
        everything = run_qnnctl("uninstall", "--all")
        first.finish()
        second.finish()
    for result in (named, everything):
        assert result.returncode == 1, result.stderr
        assert _in_use(result.stderr, first.pid, VERSION, roots[VERSION], "warning"), result.stderr
        assert _in_use(result.stderr, second.pid, OTHER_VERSION, roots[OTHER_VERSION], "warning"), result.stderr
    assert f"removed SDK {THIRD} (" in named.stderr
    assert everything.stderr.endswith(
        f"qnnctl: error: 2 SDKs in use were left in place: {OTHER_VERSION}, {VERSION}\nqnnctl: hint: run it again "
        f"once those processes have ended, or `qnnctl uninstall --wait {OTHER_VERSION} {VERSION}` to wait for "
        "them\n")
    assert sorted(p.name for p in (cache_dir / "sdks").iterdir()) == sorted([VERSION, OTHER_VERSION])
    assert run_qnnctl("uninstall", "--all").returncode == 0
    assert list((cache_dir / "sdks").iterdir()) == []


def _waiting(args: list[str], says: str) -> subprocess.Popen[str]:
    """`qnnctl ARGS`, once it has said (its first line on stderr) that it waits for `says`
    among the holders (listed by PID: a `sleep` the held shell runs holds the SDK too, and after
    the PIDs wrap around it may come first)."""
    proc = subprocess.Popen([sys.executable, "-m", "qnnctl", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(60, proc.kill)  # a qnnctl that neither says it waits nor ends
    watchdog.start()
    try:
        assert proc.stderr is not None
        said = proc.stderr.readline()
        assert said.startswith("qnnctl: waiting for "), said
        assert says in said, said
    except BaseException:
        proc.kill()
        raise
    finally:
        watchdog.cancel()
    return proc


@pytest.mark.parametrize("how", ["one", "except"])
def test_uninstall_wait_removes_the_sdk_once_its_pipeline_has_ended(cache_dir: Path, tmp_path: Path,
                                                                     how: str) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    args = ["uninstall", "--wait", VERSION] if how == "one" else ["uninstall", "--wait", "--except", OTHER_VERSION]
    with pipeline(tmp_path) as running:
        waiting = _waiting(args, f"PID {running.pid} (sh -c ")
        assert waiting.poll() is None
        assert (root / ".qnnctl.json").is_file()
        code, out, err = running.finish()
    assert (code, out) == (0, f"{root / HTP}\n"), err
    _, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert not root.exists()
    assert (cache_dir / "sdks" / OTHER_VERSION).is_dir()


def test_install_force_leaves_the_sdk_of_a_running_pipeline_without_downloading(
        mirror: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    installed = run_qnnctl("install", VERSION)
    assert installed.returncode == 0, installed.stderr
    root = Path(installed.stdout.strip())
    before = read_manifest(root)
    with pipeline(tmp_path) as running:
        forced = run_qnnctl("install", "--force", VERSION)
        code, out, err = running.finish()
    assert (code, out) == (0, f"{root / HTP}\n"), err
    assert forced.returncode == 1, forced.stderr
    assert forced.stderr.endswith("; it was not replaced\nqnnctl: hint: run it again once that process has ended, "
                                  "or the same `qnnctl install` with --wait to wait for it\n")
    assert _in_use(forced.stderr.splitlines()[0], running.pid, VERSION, root), forced.stderr
    assert forced.stdout == ""
    assert len(mirror.requests_for(PATH)) == 1  # the first install's: nothing fetched for nothing
    assert read_manifest(root) == before
    again = run_qnnctl("install", "--force", VERSION)
    assert again.returncode == 0, again.stderr
    assert (read_manifest(root) or {})["installed_at"] >= (before or {})["installed_at"]
    assert len(mirror.requests_for(PATH)) == 2


class _Reinstall(NamedTuple):
    root: Path  # the SDK installed first
    marker: Path  # a file only that install's folder holds
    opened: threading.Event  # set: the held download goes on
    forcing: subprocess.Popen[str]  # the reinstall, its download held open


@contextmanager
def _reinstall_held_in_its_download(mirror: FaultServer, *options: str) -> Iterator[_Reinstall]:
    """SDK VERSION installed, then `qnnctl install --force OPTIONS VERSION` started, its download
    held open by the server until `opened` is set; killed at the end if it is still running."""
    installed = run_qnnctl("install", VERSION)
    assert installed.returncode == 0, installed.stderr
    root = Path(installed.stdout.strip())
    marker = root / "docs" / "left-by-the-first-install"
    marker.write_text("")
    opened = threading.Event()
    mirror.fail(PATH, Fault.gate(opened))
    forcing = subprocess.Popen([sys.executable, "-m", "qnnctl", "install", "--force", *options, VERSION],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, forcing.kill)  # a qnnctl that neither says it waits nor ends
    watchdog.start()
    try:
        deadline = time.monotonic() + 60
        while len(mirror.requests_for(PATH)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(mirror.requests_for(PATH)) == 2, "the reinstall never started its download"
        yield _Reinstall(root, marker, opened, forcing)
    finally:
        watchdog.cancel()
        opened.set()
        if forcing.poll() is None:
            forcing.kill()
            forcing.communicate()


def test_install_force_that_finds_a_pipeline_started_during_its_download_leaves_the_sdk(
        mirror: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    with _reinstall_held_in_its_download(mirror) as reinstall, pipeline(tmp_path) as running:
        reinstall.opened.set()
        out, err = reinstall.forcing.communicate(timeout=120)
        code, listed, said = running.finish()
    root = reinstall.root
    assert (code, listed) == (0, f"{root / HTP}\n"), said
    assert reinstall.forcing.returncode == 1, err
    assert f"SDK {VERSION} ({root}) is in use by PID " in err
    assert f"PID {running.pid} (sh -c " in err
    assert "it was not replaced" in err
    assert out == ""
    assert reinstall.marker.exists()  # the same folder, not the new one
    assert sorted(p.name for p in (cache_dir / "sdks").iterdir()) == [VERSION]


def test_install_force_wait_waits_for_a_pipeline_started_during_its_download(
        mirror: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    """The check made once the new SDK is built waits too, under --wait, for a pipeline that began
    to use the old one while it was downloaded; then replaces it."""
    with _reinstall_held_in_its_download(mirror, "--wait") as reinstall:
        forcing = reinstall.forcing
        with pipeline(tmp_path) as running:
            reinstall.opened.set()
            assert forcing.stderr is not None
            said = ""
            for said in iter(forcing.stderr.readline, ""):  # until it says it waits, or ends
                if said.startswith("qnnctl: waiting for"):
                    break
            assert said.startswith("qnnctl: waiting for "), said
            assert f"PID {running.pid} (sh -c " in said, said  # among the holders, by PID
            assert reinstall.marker.exists()
            code, listed, err = running.finish()
        out, rest = forcing.communicate(timeout=120)
    assert (code, listed) == (0, f"{reinstall.root / HTP}\n"), err
    assert forcing.returncode == 0, rest
    assert out == f"{reinstall.root}\n"
    assert not reinstall.marker.exists()  # replaced, once the pipeline had ended


def test_install_force_wait_replaces_the_sdk_once_its_pipeline_has_ended(
        mirror: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    installed = run_qnnctl("install", VERSION)
    assert installed.returncode == 0, installed.stderr
    root = Path(installed.stdout.strip())
    marker = root / "docs" / "left-by-the-first-install"
    marker.write_text("")
    with pipeline(tmp_path) as running:
        waiting = _waiting(["install", "--force", "--wait", VERSION], f"PID {running.pid} (sh -c ")
        assert marker.exists()
        code, out, err = running.finish()
    assert (code, out) == (0, f"{root / HTP}\n"), err
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    assert out == f"{root}\n"
    assert not marker.exists()  # replaced


def test_setup_sdk_holds_the_sdk_for_the_life_of_its_process(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    code = textwrap.dedent(f"""\
        import sys, qnnctl
        qnnctl.setup_sdk({VERSION!r})
        print("ready", flush=True)
        sys.stdin.readline()
        import ctypes
        ctypes.CDLL(sys.argv[1])  # a library loaded late, from the SDK still in place
        print("loaded", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(root / "lib/x86_64-linux-clang/libQnnCpu.so")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdin is not None
        assert proc.stdout.readline() == "ready\n", proc.stderr.read() if proc.stderr else ""
        refused = run_qnnctl("uninstall", VERSION)
        assert refused.returncode == 1, refused.stderr
        assert f"SDK {VERSION} ({root}) is in use by PID {proc.pid} ({sys.executable} -c " in refused.stderr
        forced = run_qnnctl("install", "--force", VERSION)  # refused before it looks for a download
        assert forced.returncode == 1, forced.stderr
        assert "it was not replaced" in forced.stderr
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, out) == (0, "loaded\n"), err
    removed = run_qnnctl("uninstall", VERSION)
    assert removed.returncode == 0, removed.stderr


def test_an_sdk_removed_before_it_was_held_is_not_used(cache_dir: Path, tmp_path: Path) -> None:
    cache = Cache(cache_dir)
    root = install_tree_into_cache(cache_dir, VERSION)
    (root / ".qnnctl.json").unlink()  # as an uninstall between finding it and holding it leaves it
    with pytest.raises(QnnctlError, match=f"SDK {VERSION} was removed from qnnctl's cache while it was being set up"):
        hold_sdk(root, cache)
    assert held_by(cache, VERSION) == []
    elsewhere = build_sdk_tree(tmp_path / "elsewhere" / VERSION)
    fd = hold_sdk(elsewhere, cache)  # held by its folder, wherever it is
    assert fd is not None
    assert os.fstat(fd).st_ino == elsewhere.stat().st_ino
    assert [h.pid for h in holders_of(elsewhere)] == [os.getpid()]
    os.close(fd)
    assert holders_of(elsewhere) == []
    shutil.rmtree(elsewhere)
    with pytest.raises(QnnctlError, match=f"SDK {elsewhere} was removed from {elsewhere} while it was being set up"):
        hold_sdk(elsewhere, cache)


def test_an_sdk_replaced_while_a_hold_waited_is_held_at_its_new_folder(cache_dir: Path, tmp_path: Path) -> None:
    cache = Cache(cache_dir)
    root = install_tree_into_cache(cache_dir, VERSION)
    new = build_sdk_tree(tmp_path / "new")
    (new / ".qnnctl.json").write_text("{}")
    holding: list[int | None] = []
    waiting = threading.Event()

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("waiting for "):
                waiting.set()

    said = Said()
    logging.getLogger("qnnctl.sdk.holds").addHandler(said)
    logging.getLogger("qnnctl.sdk.holds").setLevel(logging.INFO)
    try:
        with exclusive(VERSION, root, "replaced"):
            waiter = threading.Thread(target=lambda: holding.append(hold_sdk(root, cache)))
            waiter.start()
            assert waiting.wait(30), "the hold never waited"
            old = tmp_path / "old"
            os.replace(root, old)
            os.replace(new, root)
    finally:
        logging.getLogger("qnnctl.sdk.holds").removeHandler(said)
    waiter.join(30)
    (fd,) = holding
    assert fd is not None
    assert os.fstat(fd).st_ino == root.stat().st_ino  # the new folder, not the one moved away
    os.close(fd)


def test_a_lock_held_for_long_on_an_sdk_is_named_not_waited_for_in_silence(
        cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anyone who can read an SDK's folder can lock it: a new hold waits for a move, not for ever."""
    from qnnctl.sdk import holds

    root = install_tree_into_cache(cache_dir, VERSION)
    monkeypatch.setattr(holds, "HOLD_WAIT", 0.3)
    other = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        with pytest.raises(QnnctlError, match=rf"locked by PID {os.getpid()} .* for longer than 0 s; it was not used"):
            hold_sdk(root, Cache(cache_dir))
    finally:
        os.close(other)
    fd = hold_sdk(root, Cache(cache_dir))
    assert fd is not None
    os.close(fd)


def test_a_pipeline_holds_its_sdk_in_a_cache_other_than_its_own(tmp_path: Path, cache_dir: Path) -> None:
    """A shared cache's SDK used through QNN_SDK_ROOT by a pipeline whose QNNCTL_CACHE_DIR is
    the user's own: an uninstall in the shared cache leaves it in place."""
    shared = tmp_path / "shared-cache"
    root = install_tree_into_cache(shared, VERSION)
    mine = {**os.environ, "QNN_SDK_ROOT": str(root), "QNNCTL_CACHE_DIR": str(cache_dir)}
    with pipeline(tmp_path, "", env=mine) as running:
        refused = run_qnnctl("uninstall", VERSION, env={**os.environ, "QNNCTL_CACHE_DIR": str(shared)})
        code, out, err = running.finish()
    assert refused.returncode == 1, refused.stderr
    assert _in_use(refused.stderr, running.pid, VERSION, root), refused.stderr
    assert (code, out) == (0, f"{root / HTP}\n"), err
    assert (root / ".qnnctl.json").is_file()


def test_doctor_names_a_held_sdk_removed_under_its_pipeline(cache_dir: Path, tmp_path: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    other = install_tree_into_cache(cache_dir, OTHER_VERSION)
    env = {**os.environ, "QNNCTL_FORCE_CPU_VENDOR": "GenuineIntel"}

    def cache_check() -> dict[str, str]:
        result = run_qnnctl("doctor", "--json", "--offline", "--sdk", OTHER_VERSION, env=env)
        return next(check for check in json.loads(result.stdout)["checks"] if check["id"] == "cache")

    with pipeline(tmp_path) as running, pipeline(tmp_path, OTHER_VERSION, "other"):
        assert cache_check()["status"] == "ok"  # held and whole: nothing to say
        # What no qnnctl does (an uninstall leaves a held SDK in place): removed by hand.
        shutil.rmtree(root)
        (other / HTP).unlink()
        check = cache_check()
        running.finish()
    assert check["status"] == "warn"
    assert f"SDK {VERSION} is in use by PID " in check["detail"]
    assert f"PID {running.pid} (sh -c " in check["detail"]
    assert f"but {root} is gone: removed by hand or by a qnnctl that did not know holds" in check["detail"]
    assert f"SDK {OTHER_VERSION} is in use by PID " in check["detail"]
    assert f"but {other} is missing {HTP}" in check["detail"]
    assert f"let them end, then `qnnctl install --force {VERSION}`" in check["hint"]
    assert f"SDK {VERSION} is in use" not in cache_check()["detail"]  # its pipeline has ended


def test_components_added_to_a_held_sdk_wait_for_its_pipeline(mirror: FaultServer, cache_dir: Path,
                                                               tmp_path: Path) -> None:
    installed = run_qnnctl("install", VERSION, "--components", "host")
    assert installed.returncode == 0, installed.stderr
    root = Path(installed.stdout.strip())
    with pipeline(tmp_path) as running:
        added = run_qnnctl("install", VERSION, "--components", "host,docs")
        assert not (root / "docs").exists()
        waiting = _waiting(["install", VERSION, "--components", "host,docs", "--wait"],
                           f"PID {running.pid} (sh -c ")
        code, out, err = running.finish()
    assert (code, out) == (0, f"{root / HTP}\n"), err
    assert added.returncode == 1, added.stderr
    assert f"SDK {VERSION} ({root}) is in use by PID " in added.stderr
    assert f"PID {running.pid} (sh -c " in added.stderr
    assert "it was not replaced" in added.stderr
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    assert (root / "docs" / "payload.bin").is_file()
    assert (read_manifest(root) or {})["components"] == ["host", "docs"]


@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])
def test_a_python_pipeline_holds_its_sdk_through_the_bootstrap_too(cache_dir: Path, tmp_path: Path,
                                                                   vendor: str) -> None:
    # On AMD, `python -I` skips qnnctl's sitecustomize, so lower starts it through its bootstrap:
    # the hold must live through that exec too.
    install_tree_into_cache(cache_dir, VERSION)
    started = tmp_path / "started"
    code = "import sys; open(sys.argv[1], 'w').close(); sys.stdin.readline()"
    proc = subprocess.Popen([sys.executable, "-m", "qnnctl", "lower", "--sdk", VERSION, "--", sys.executable, "-I",
                             "-c", code, str(started)],
                            env={**os.environ, "QNNCTL_FORCE_CPU_VENDOR": vendor}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for("the pipeline", started, proc)
        holders = held_by(Cache(cache_dir), VERSION)
        assert [holder.pid for holder in holders] == [proc.pid]
        assert holders[0].command.startswith(f"{sys.executable} -I ")
        assert ("bootstrap.py" in holders[0].command) == (vendor == "AuthenticAMD")
    finally:
        proc.communicate("\n", timeout=60)
    assert proc.returncode == 0
    assert held_by(Cache(cache_dir), VERSION) == []


def test_a_hold_that_cannot_be_made_is_said_and_the_sdk_used(cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """On a file system that takes no locks (NFS without its lock daemon: ENOLCK), as flock says."""
    root = install_tree_into_cache(cache_dir, VERSION)

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert hold_sdk(root, Cache(cache_dir)) is None
    assert caplog.messages == [f"cannot hold SDK {root} (No locks available): an uninstall could remove it while "
                               "it is in use"]
