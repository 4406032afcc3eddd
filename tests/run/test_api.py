"""setup_sdk(): the SDK made usable in the calling process, once, from any thread."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

import qnnctl
from qnnctl.errors import DownloadError, IntegrityError, QnnctlError, UsageError
from qnnctl.run import api
from qnnctl.sdk.layout import Sdk
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import (
    OTHER_VERSION,
    VERSION,
    SdkSpec,
    build_sdk_tree,
    compile_shared,
    install_tree_into_cache,
)

ARCHIVE = f"/{VERSION}/v{VERSION}.zip"
HOST_LIBS = ("libQnnHtp.so", "libQnnSystem.so")


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if this process had never called setup_sdk; both variables put back after the test."""
    for name in api.MANAGED:
        # setenv records the variable's state, so that the test's own changes are undone too.
        monkeypatch.setenv(name, "-")
        monkeypatch.delenv(name)
    monkeypatch.setattr(api, "_state", api._State())


def managed() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in api.MANAGED}


def set_managed(values: Mapping[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def mapped_libraries() -> str:
    return Path("/proc/self/maps").read_text()


def lib_dir(root: Path) -> Path:
    return root / "lib" / "x86_64-linux-clang"


BEFORE_STATES = [
    pytest.param({"QNN_SDK_ROOT": None, "LD_LIBRARY_PATH": None}, id="both-unset"),
    pytest.param({"QNN_SDK_ROOT": "/before/root", "LD_LIBRARY_PATH": "/a:/b"}, id="both-set"),
    pytest.param({"QNN_SDK_ROOT": None, "LD_LIBRARY_PATH": ""}, id="empty-ld-path"),
]


# -- once, from any thread --------------------------------------------------------------


def test_eight_threads_at_once_install_once(mirror: FaultServer, cache_dir: Path) -> None:
    barrier = threading.Barrier(8)
    results: list[Sdk] = []
    errors: list[BaseException] = []
    path_before = os.environ.get("PATH")

    def call() -> None:
        barrier.wait()
        try:
            results.append(qnnctl.setup_sdk())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(results) == 8
    assert all(sdk is results[0] for sdk in results)
    assert len(mirror.requests_for(ARCHIVE)) == 1
    root = cache_dir / "sdks" / VERSION
    assert results[0].root == root
    assert managed() == {"QNN_SDK_ROOT": str(root), "LD_LIBRARY_PATH": str(lib_dir(root))}
    assert os.environ.get("PATH") == path_before
    maps = mapped_libraries()
    for name in HOST_LIBS:
        assert str(lib_dir(root) / name) in maps
    # Remembered: later calls make no request and return the same SDK.
    assert qnnctl.setup_sdk() is results[0]
    assert qnnctl.setup_sdk(VERSION) is results[0]
    assert qnnctl.setup_sdk("2.37") is results[0]
    assert len(mirror.requests_for(ARCHIVE)) == 1


def test_installing_prints_no_progress_bar(mirror: FaultServer, cache_dir: Path,
                                          capfd: pytest.CaptureFixture[str]) -> None:
    """The calling program owns its terminal: a download's progress goes to logging, not a bar."""
    assert qnnctl.setup_sdk().root == cache_dir / "sdks" / VERSION
    assert len(mirror.requests_for(ARCHIVE)) == 1
    assert capfd.readouterr() == ("", "")


def test_another_sdk_cannot_replace_the_one_set_up(cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir)
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    other = cache_dir / "sdks" / OTHER_VERSION
    sdk = qnnctl.setup_sdk()
    for spec in (OTHER_VERSION, str(other)):
        with pytest.raises(UsageError) as caught:
            qnnctl.setup_sdk(spec)
        assert (caught.value.message, caught.value.hint) == (
            f"SDK {VERSION} ({sdk.root}) is already set up in this process; {spec} cannot replace it",
            "use one SDK per process: start a new process for another one",
        )
    assert qnnctl.setup_sdk(str(sdk.root)) is sdk
    assert managed() == {"QNN_SDK_ROOT": str(sdk.root), "LD_LIBRARY_PATH": str(lib_dir(sdk.root))}


def test_later_calls_do_not_wait_for_the_lock(cache_dir: Path) -> None:
    """Once set up, a call is a read: it returns while another thread holds the lock (a first
    attempt that failed and is retried elsewhere, the once-only warning)."""
    install_tree_into_cache(cache_dir)
    sdk = qnnctl.setup_sdk()
    results: list[Sdk] = []
    with api._state.lock:
        thread = threading.Thread(target=lambda: results.append(qnnctl.setup_sdk()), daemon=True)
        thread.start()
        thread.join(timeout=10)
        returned = not thread.is_alive()
    thread.join()
    assert returned
    assert results == [sdk]


@pytest.mark.parametrize("spelling", ["canonical", "trailing-slash", "relative", "home"])
def test_sdk_root_from_the_environment_is_not_rewritten(tmp_path: Path, spelling: str) -> None:
    """The user's QNN_SDK_ROOT stays exactly as they spelt it; only LD_LIBRARY_PATH gains the
    SDK's libraries, by their absolute path (a relative entry would follow the working folder)."""
    root = build_sdk_tree((Path(os.environ["HOME"]) if spelling == "home" else Path.cwd()) / "users-sdk")
    value = {"canonical": str(root), "trailing-slash": f"{root}/", "relative": "users-sdk",
             "home": "~/users-sdk"}[spelling]
    set_managed({"QNN_SDK_ROOT": value, "LD_LIBRARY_PATH": "/opt/mine"})
    sdk = qnnctl.setup_sdk()
    assert sdk.root == root
    assert managed() == {"QNN_SDK_ROOT": value, "LD_LIBRARY_PATH": f"{lib_dir(root)}:/opt/mine"}


def test_preload_lets_bare_names_resolve_in_this_process(cache_dir: Path, tmp_path: Path) -> None:
    # Real SDK libraries carry a soname; with one loaded, a later dlopen of the bare name finds
    # it, although LD_LIBRARY_PATH was not set when this process started.
    root = install_tree_into_cache(cache_dir)
    for name in HOST_LIBS:
        stem = name.removeprefix("lib").removesuffix(".so").lower()
        compile_shared(lib_dir(root) / name, f"int qnn_{stem}_version(void) {{ return 42; }}\n",
                       extra=[f"-Wl,-soname,{name}"])
    code = textwrap.dedent("""\
        import ctypes, qnnctl
        try:
            ctypes.CDLL("libQnnHtp.so")
            print("loadable before setup")
        except OSError:
            pass
        qnnctl.setup_sdk()
        print(ctypes.CDLL("libQnnHtp.so").qnn_qnnhtp_version())
        print(ctypes.CDLL(None).qnn_qnnsystem_version())  # RTLD_GLOBAL: in the global scope
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["42", "42"]


# -- failures are undone and forgotten ---------------------------------------------------


def _unloadable_htp(root: Path, tmp_path: Path) -> None:
    """libQnnHtp.so that needs a library which is nowhere: dlopen fails as with a missing libc++."""
    gone = compile_shared(tmp_path / "gone" / "libqnnctl_gone.so", "int gone(void) { return 1; }\n")
    compile_shared(lib_dir(root) / "libQnnHtp.so", "int gone(void);\nint qnn_htp(void) { return gone(); }\n",
                   extra=[f"-L{gone.parent}", "-Wl,--no-as-needed", "-lqnnctl_gone"])
    gone.unlink()


@pytest.mark.parametrize("before", BEFORE_STATES)
def test_library_load_failure_restores_both_variables(
    cache_dir: Path, tmp_path: Path, before: dict[str, str | None]
) -> None:
    root = install_tree_into_cache(cache_dir)
    _unloadable_htp(root, tmp_path)
    set_managed(before)
    with pytest.raises(api.LibraryLoadError) as caught:
        qnnctl.setup_sdk(VERSION)
    htp = lib_dir(root) / "libQnnHtp.so"
    assert caught.value.path == htp
    assert (caught.value.message, caught.value.hint) == (
        f"cannot load {htp}: libqnnctl_gone.so: cannot open shared object file: No such file or directory",
        "run `qnnctl doctor` to see what the SDK's libraries need",
    )
    assert managed() == before
    # Not remembered: with the library fixed, the next call succeeds.
    compile_shared(lib_dir(root) / "libQnnHtp.so", "int qnn_htp(void) { return 1; }\n")
    sdk = qnnctl.setup_sdk(VERSION)
    assert sdk.root == root
    assert os.environ["QNN_SDK_ROOT"] == str(root)


@pytest.mark.parametrize("before", BEFORE_STATES)
def test_ctrl_c_while_loading_restores_both_variables(cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                      before: dict[str, str | None]) -> None:
    """A KeyboardInterrupt (no Exception) after the variables were changed, while the libraries
    load: the variables are put back all the same, and nothing is remembered."""
    root = install_tree_into_cache(cache_dir)
    set_managed(before)
    seen: list[dict[str, str | None]] = []
    real = api.preload

    def interrupted(lib: Path, names: object = None) -> list[Path]:
        seen.append(managed())
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "preload", interrupted)
    with pytest.raises(KeyboardInterrupt):
        qnnctl.setup_sdk(VERSION)
    assert seen == [{"QNN_SDK_ROOT": str(root), "LD_LIBRARY_PATH": _join(str(lib_dir(root)),
                                                                           before["LD_LIBRARY_PATH"])}]
    assert managed() == before
    monkeypatch.setattr(api, "preload", real)
    assert qnnctl.setup_sdk(VERSION).root == root


def _join(entry: str, rest: str | None) -> str:
    return f"{entry}:{rest}" if rest else entry


@pytest.mark.parametrize("before", BEFORE_STATES[:2])
def test_failed_download_restores_variables_and_is_not_remembered(
    mirror: FaultServer, cache_dir: Path, before: dict[str, str | None]
) -> None:
    mirror.fail(ARCHIVE, Fault.status(404))
    set_managed(before)
    with pytest.raises(DownloadError):
        qnnctl.setup_sdk(VERSION)
    assert managed() == before
    sdk = qnnctl.setup_sdk(VERSION)
    assert sdk.root == cache_dir / "sdks" / VERSION
    assert len(mirror.requests_for(ARCHIVE)) == 2


def test_corrupt_archive_restores_variables_and_is_not_remembered(mirror: FaultServer, cache_dir: Path) -> None:
    good = mirror.files[ARCHIVE]
    mirror.add(ARCHIVE, b"PK\x03\x04" + b"\x00" * 4096)
    set_managed({"QNN_SDK_ROOT": None, "LD_LIBRARY_PATH": "/kept"})
    with pytest.raises(IntegrityError):
        qnnctl.setup_sdk()
    assert managed() == {"QNN_SDK_ROOT": None, "LD_LIBRARY_PATH": "/kept"}
    mirror.add(ARCHIVE, good)
    assert qnnctl.setup_sdk().root == cache_dir / "sdks" / VERSION


# -- QNN_SDK_ROOT exported but empty: the caller's SDK ------------------------------------


def test_empty_root_uses_the_callers_sdk_and_changes_nothing(mirror: FaultServer, tmp_path: Path) -> None:
    root = build_sdk_tree(tmp_path / "callers-sdk")
    before = {"QNN_SDK_ROOT": "", "LD_LIBRARY_PATH": f"/opt/other:{lib_dir(root)}"}
    set_managed(before)
    sdk = qnnctl.setup_sdk()
    assert (sdk.root, sdk.version, sdk.origin) == (root, VERSION, "LD_LIBRARY_PATH")
    assert managed() == before
    assert str(lib_dir(root) / "libQnnHtp.so") in mapped_libraries()
    assert mirror.requests == []


def test_callers_sdk_that_names_no_version_is_unknown(mirror: FaultServer, tmp_path: Path) -> None:
    # No sdk.yaml, no manifest, no build id, and a folder whose name is no version.
    root = build_sdk_tree(tmp_path / "callers-sdk", SdkSpec(sdk_yaml=False))
    set_managed({"QNN_SDK_ROOT": "", "LD_LIBRARY_PATH": str(lib_dir(root))})
    sdk = qnnctl.setup_sdk()
    assert (sdk.root, sdk.version, sdk.origin) == (root, "unknown", "LD_LIBRARY_PATH")
    assert mirror.requests == []


def test_empty_root_without_an_sdk_is_a_clear_error(mirror: FaultServer, tmp_path: Path) -> None:
    before = {"QNN_SDK_ROOT": "", "LD_LIBRARY_PATH": "/opt/other"}
    set_managed(before)
    with pytest.raises(QnnctlError) as caught:
        qnnctl.setup_sdk()
    assert (caught.value.message, caught.value.hint) == (
        "QNN_SDK_ROOT is exported but empty, which leaves the SDK to the caller, and no folder on "
        "LD_LIBRARY_PATH is an SDK's lib/x86_64-linux-clang",
        "export LD_LIBRARY_PATH=<sdk>/lib/x86_64-linux-clang before Python starts, "
        "or unset QNN_SDK_ROOT to let qnnctl set the SDK up",
    )
    assert managed() == before
    assert mirror.requests == []
    # Not remembered either: once the caller puts an SDK on LD_LIBRARY_PATH, it is used.
    root = build_sdk_tree(tmp_path / "callers-sdk")
    os.environ["LD_LIBRARY_PATH"] = str(lib_dir(root))
    assert qnnctl.setup_sdk().root == root


def test_a_cache_no_path_list_can_hold_is_refused_before_any_download(
        mirror: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(tmp_path / "a:b"))
    set_managed({"QNN_SDK_ROOT": None, "LD_LIBRARY_PATH": "/kept"})
    with pytest.raises(UsageError, match="':'"):
        qnnctl.setup_sdk(VERSION)
    assert mirror.requests == []
    assert managed() == {"QNN_SDK_ROOT": None, "LD_LIBRARY_PATH": "/kept"}


# -- the staged libc++ trio --------------------------------------------------------------


def _host_has_trio() -> bool:
    from qnnctl.host.needs import missing_host_libraries
    from qnnctl.host.staged import TRIO

    return not missing_host_libraries(TRIO, [])


def test_a_host_without_libcxx_gets_the_trio_staged_and_loaded_first(
        server: FaultServer, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An SDK whose libQnnHtp.so needs libc++.so.1, on a host without it: setup_sdk stages the
    trio from the archive QNNCTL_LLVM_URL names (apt-get fails, as offline), loads it, and only
    then the SDK's libraries, which find libc++.so.1 by its soname."""
    if _host_has_trio():
        pytest.skip("this host has libc++.so.1 and friends, so nothing is staged")
    from qnnctl.sdk.cache import Cache
    from tests.host.test_runtime import llvm_archive

    data, _ = llvm_archive(tmp_path, big=1 << 20)
    monkeypatch.setenv("QNNCTL_LLVM_URL", server.add("/llvm.tar.xz", data, "application/x-xz"))
    apt = tmp_path / "bin" / "apt-get"
    apt.parent.mkdir()
    apt.write_text("#!/bin/sh\nexit 100\n")
    apt.chmod(0o755)
    monkeypatch.setenv("PATH", f"{apt.parent}:{os.environ['PATH']}")
    root = install_tree_into_cache(cache_dir)
    compile_shared(lib_dir(root) / "libQnnHtp.so",
                   "int libcxx_stub(void);\nint qnn_htp(void) { return libcxx_stub(); }\n",
                   extra=[f"-L{tmp_path / 'stubs'}", "-Wl,--no-as-needed", "-l:libc++.so.1"])
    sdk = qnnctl.setup_sdk(VERSION)
    staged = cache_dir / "runtime" / "libcxx-14.0.0" / "lib"
    assert managed() == {"QNN_SDK_ROOT": str(root), "LD_LIBRARY_PATH": f"{lib_dir(root)}:{staged}"}
    maps = mapped_libraries()
    for path in [*(staged / name for name in api.RUNTIME_PRELOAD), lib_dir(root) / "libQnnHtp.so"]:
        assert str(path) in maps
    # What each preload returns: the libraries it loaded, in order (libQnnHtpPrepare.so is absent).
    assert api.preload_runtime(Cache(cache_dir), sdk) == [staged / name for name in api.RUNTIME_PRELOAD]
    assert api.preload(lib_dir(root)) == [lib_dir(root) / "libQnnSystem.so", lib_dir(root) / "libQnnHtp.so"]


def test_a_staged_trio_is_not_loaded_for_an_sdk_that_ships_its_own(cache_dir: Path, tmp_path: Path) -> None:
    """An SDK before 2.23 ships the trio: a trio staged in the cache for another SDK stays out."""
    from qnnctl.host.runtime import RuntimeRequest, stage_runtime
    from qnnctl.sdk.cache import Cache
    from tests.host.test_runtime import stub_trio

    stub_trio(tmp_path / "given")
    staged = stage_runtime(Cache(cache_dir), None, RuntimeRequest(sources=(tmp_path / "given",), force=True,
                                                                  use_apt=False), os.environ).libcxx
    assert staged is not None
    root = install_tree_into_cache(cache_dir)
    stub_trio(lib_dir(root))
    sdk = qnnctl.setup_sdk(VERSION)
    assert managed() == {"QNN_SDK_ROOT": str(root), "LD_LIBRARY_PATH": str(lib_dir(root))}
    maps = mapped_libraries()
    assert str(lib_dir(root) / "libQnnHtp.so") in maps
    assert str(staged.lib_dir) not in maps
    assert api.preload_runtime(Cache(cache_dir), sdk) == []
