"""`qnnctl doctor` on SDK trees with real ELF libraries, a real loopback server and real
child processes. Most checks run in-process through `diagnose`; the CLI contract (exit codes,
JSON, plain text, the table on a terminal) runs the real entry point."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from qnnctl.doctor.context import Context, Target
from qnnctl.doctor.diagnose import CHECKS, diagnose, run_checks
from qnnctl.doctor.host import glibc_verdict, missing_hint
from qnnctl.doctor.report import (
    FAIL,
    OK,
    SKIP,
    WARN,
    Outcome,
    Result,
    Skip,
    exit_code,
    render_json,
    render_table,
    render_text,
    summary,
)
from qnnctl.errors import QnnctlError
from qnnctl.host import machine as host
from qnnctl.run.envplan import environment_for
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.layout import HOST_BIN_DIR, HOST_LIB_DIR, Sdk
from qnnctl.sdk.select import Selection
from qnnctl.sdk.vouchers import vouchers
from qnnctl.shell.exports import apply
from tests.conftest import read_terminal, require_tool, run_qnnctl
from tests.httpserver import FaultServer, self_signed_certificate
from tests.lowerkit import AMD_CPUINFO, write_cpuinfo
from tests.sdkfactory import (
    OTHER_VERSION,
    VERSION,
    SdkSpec,
    build_archive,
    build_sdk_tree,
    compile_shared,
    install_tree_into_cache,
)

IDS = [check_id for check_id, _ in CHECKS]
STABLE_IDS = ["host", "sdk.selection", "sdk.layout", "sdk.version", "sdk.manifest", "sdk.verify", "libraries",
              "glibc", "libstdc++", "load", "environment", "executorch", "onnxruntime", "cpu", "cache", "network",
              "lock", "stores"]

GLIBC_234_SOURCE = """
#include <pthread.h>
__asm__(".symver pthread_create, pthread_create@GLIBC_2.34");
int qnn_htp_start(pthread_t *t, void *(*f)(void *)) { return pthread_create(t, 0, f, 0); }
"""


@pytest.fixture(autouse=True)
def _known_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Name the CPU vendor, so no doctor run waits for py-cpuinfo (test_cpu_* read it)."""
    monkeypatch.setenv("QNNCTL_FORCE_CPU_VENDOR", "GenuineIntel")


def sdk_tree(tmp_path: Path, version: str = VERSION, **spec: object) -> Path:
    return build_sdk_tree(tmp_path / "qairt" / version, SdkSpec(version=version, **spec))  # type: ignore[arg-type]


def doctor(spec: str | None = None, offline: bool = True, verify: bool = False) -> dict[str, Result]:
    results = diagnose(spec, dict(os.environ), Path.cwd(), offline=offline, verify=verify)
    assert [r.id for r in results] == IDS
    return {r.id: r for r in results}


def link_against_missing(lib_dir: Path, target: str, soname: str) -> None:
    """Replace lib_dir/target with a library that needs `soname`, which then disappears."""
    dep = compile_shared(lib_dir.parent / "gone" / soname, "int gone(void) { return 1; }\n",
                         [f"-Wl,-soname,{soname}"])
    compile_shared(lib_dir / target, "int gone(void);\nint qnn(void) { return gone(); }\n",
                   [f"-Wl,-soname,{target}", str(dep)])
    dep.unlink()


def host_has(soname: str) -> bool:
    from qnnctl.host.elf import DEFAULT_DIRS

    return soname in host.read_ld_cache() or any(Path(d, soname).exists() for d in DEFAULT_DIRS)


# -- the report and the CLI contract -------------------------------------------------------------


def test_ids_are_stable() -> None:
    assert IDS == STABLE_IDS


def test_healthy_sdk_json_exit_codes_and_strict(tmp_path: Path) -> None:
    root = sdk_tree(tmp_path)
    result = run_qnnctl("doctor", "--sdk", str(root), "--json", "--offline")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"schema", "ok", "checks"}
    assert report["schema"] == 1
    assert report["ok"] is True
    assert [c["id"] for c in report["checks"]] == STABLE_IDS
    for check in report["checks"]:
        assert set(check) == {"id", "status", "detail", "hint"}
        assert check["status"] in ("ok", "warn", "fail", "skip")
        assert isinstance(check["detail"], str)
        assert "\n" not in check["detail"]
        assert check["hint"] is None or isinstance(check["hint"], str)
    status = {c["id"]: c["status"] for c in report["checks"]}
    assert status["libraries"] == status["load"] == status["glibc"] == status["sdk.layout"] == "ok"
    assert status["network"] == "skip"
    # The shell was never set up for this SDK: a warning, which --strict turns into a failure.
    assert status["environment"] == "warn"
    strict = run_qnnctl("doctor", "--sdk", str(root), "--json", "--offline", "--strict")
    assert strict.returncode == 1
    assert json.loads(strict.stdout)["ok"] is False

    exported = run_qnnctl("env", "--sdk", str(root), "--shell", "json")
    assert exported.returncode == 0, exported.stderr
    env = apply(os.environ, json.loads(exported.stdout))
    strict_set_up = run_qnnctl("doctor", "--sdk", str(root), "--json", "--offline", "--strict", env=env)
    checks = {c["id"]: c for c in json.loads(strict_set_up.stdout)["checks"]}
    assert checks["environment"]["status"] == "ok"
    # Only a disk short of space for another SDK could still warn here.
    warned = {c["id"] for c in checks.values() if c["status"] == "warn"}
    assert warned <= {"cache"}, checks
    assert strict_set_up.returncode == (1 if warned else 0)


def test_missing_dependency_fails_with_the_loaders_own_words(tmp_path: Path) -> None:
    root = sdk_tree(tmp_path)
    link_against_missing(root / HOST_LIB_DIR, "libQnnHtp.so", "libqnnctl_absent.so")
    result = run_qnnctl("doctor", "--sdk", str(root), "--offline")
    assert result.returncode == 1
    # Piped: plain aligned text on stdout, one line per check, then the summary.
    lines = result.stdout.splitlines()
    libraries = next(line for line in lines if line.startswith("fail  libraries"))
    assert "libqnnctl_absent.so not found (needed by libQnnHtp.so)" in libraries
    load = next(line for line in lines if line.startswith("fail  load"))
    # Which library failed, and what it lacks, not only the missing file's name.
    assert "libQnnHtp.so needs libqnnctl_absent.so, which the loader cannot find (No such file or directory)" in load
    assert "\x1b[" not in result.stdout
    assert lines[-1].startswith("2 failed")
    assert any(line.strip().startswith("hint: install the package that provides libqnnctl_absent.so")
               for line in lines)


def test_libcxx_missing_names_the_packages(tmp_path: Path) -> None:
    target = Target(Selection("argument", "given"), None, None)
    assert "qnnctl install --runtime" in missing_hint("libc++.so.1", target)
    assert "apt-get install libc++1-14 libc++abi1-14 libunwind-14" in missing_hint("libc++.so.1", target)
    assert "apt-get install libc++1-14 libc++abi1-14 libunwind-14" in missing_hint("libunwind.so.1", target)
    assert "apt-get" not in missing_hint("libfoo.so", target)
    if host_has("libc++.so.1"):
        pytest.skip("this host has libc++.so.1, so an SDK library cannot miss it here")
    root = sdk_tree(tmp_path)
    link_against_missing(root / HOST_LIB_DIR, "libQnnSystem.so", "libc++.so.1")
    results = doctor(str(root))
    assert results["libraries"].status == FAIL
    assert "libc++.so.1 not found (needed by libQnnSystem.so)" in results["libraries"].detail
    assert "apt-get install libc++1-14 libc++abi1-14 libunwind-14" in (results["libraries"].hint or "")
    assert results["load"].status == FAIL
    assert "apt-get install libc++1" in (results["load"].hint or "")


def test_runpath_supplies_a_dependency_outside_ld_library_path(tmp_path: Path) -> None:
    root = sdk_tree(tmp_path)
    dep = compile_shared(root / "lib" / "deps" / "libqnnctl_dep.so", "int dep(void) { return 1; }\n",
                         ["-Wl,-soname,libqnnctl_dep.so"])
    lib = root / HOST_LIB_DIR / "libQnnSystem.so"
    compile_shared(lib, "int dep(void);\nint qnn(void) { return dep(); }\n",
                   [str(dep), "-Wl,-rpath,$ORIGIN/../deps", "-Wl,--enable-new-dtags"])
    results = doctor(str(root))
    assert results["libraries"].status == OK, results["libraries"]
    assert results["load"].status == OK, results["load"]
    dep.unlink()
    results = doctor(str(root))
    assert results["libraries"].status == FAIL
    assert "libqnnctl_dep.so not found" in results["libraries"].detail


def test_library_needing_glibc_2_34(tmp_path: Path) -> None:
    have = host.glibc_version()
    if have is None or have < (2, 34):
        pytest.skip("linking against GLIBC_2.34 needs glibc 2.34 or newer on the build host")
    root = sdk_tree(tmp_path)
    compile_shared(root / HOST_LIB_DIR / "libQnnHtp.so", GLIBC_234_SOURCE)
    results = doctor(str(root))
    assert results["glibc"].status == OK
    assert "GLIBC_2.34 needed (by libQnnHtp.so)" in results["glibc"].detail

    ctx = Context(spec=str(root), environ=dict(os.environ), cwd=Path.cwd(), offline=True,
                  glibc_reader=lambda: (2, 31))
    old = {r.id: r for r in run_checks(ctx)}
    assert old["glibc"].status == FAIL
    assert old["glibc"].detail == "libQnnHtp.so needs GLIBC_2.34; this host has glibc 2.31"
    assert "glibc 2.34 or newer" in (old["glibc"].hint or "")


def test_glibc_verdicts() -> None:
    lib = Path("/sdk/libQnnHtp.so")
    other = Path("/sdk/libQnnTFLiteDelegate.so")
    assert glibc_verdict(((2, 34), lib), (2, 36)).status == OK
    assert glibc_verdict(((2, 34), lib), (2, 34)).status == OK
    assert glibc_verdict(((2, 34), lib), (2, 31)).status == FAIL
    assert glibc_verdict(((2, 2, 5), lib), (2, 3)).status == OK
    assert glibc_verdict(((2, 27), lib), (2, 31), ((2, 35), other)).status == WARN
    assert glibc_verdict(None, (2, 31)).status == OK
    assert glibc_verdict(((2, 17), lib), None).status == FAIL


def test_broken_sdk_names_the_missing_library_and_the_tool_without_exec_bit(tmp_path: Path) -> None:
    root = sdk_tree(tmp_path)
    (root / HOST_LIB_DIR / "libQnnSystem.so").unlink()
    tool = root / HOST_BIN_DIR / "qnn-net-run"
    tool.chmod(0o644)
    results = doctor(str(root))
    assert results["sdk.selection"].status == OK
    layout = results["sdk.layout"]
    assert layout.status == FAIL
    assert f"missing {HOST_LIB_DIR}/libQnnSystem.so" in layout.detail
    assert "not executable: qnn-net-run" in layout.detail
    assert f"chmod +x {tool}" in (layout.hint or "")
    assert results["libraries"].status == FAIL
    assert "libQnnSystem.so not in" in results["libraries"].detail
    assert results["load"].status == FAIL
    assert "libQnnSystem.so cannot be found: no folder on the loader's path holds it" in results["load"].detail
    assert exit_code(list(results.values())) == 1


def test_data_files_among_the_tools_need_no_exec_bit(tmp_path: Path) -> None:
    root = sdk_tree(tmp_path, extra_files={f"{HOST_BIN_DIR}/tools.json": b"{}"})
    layout = doctor(str(root))["sdk.layout"]
    assert layout.status == OK
    assert "2 tools (executable)" in layout.detail


def test_damaged_sdk_in_the_cache_is_still_examined(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir)
    (root / HOST_LIB_DIR / "libQnnHtp.so").unlink()
    results = doctor()
    assert results["sdk.selection"].status == OK
    assert results["sdk.layout"].status == FAIL
    assert f"`qnnctl install --force {VERSION}`" in (results["sdk.layout"].hint or "")


def test_not_installed_fails_selection_and_skips_the_rest() -> None:
    results = doctor()
    selection = results["sdk.selection"]
    assert selection.status == FAIL
    assert selection.detail.startswith("default: ")
    assert selection.hint == f"run `qnnctl install {VERSION}`"
    for check_id in ("sdk.layout", "sdk.version", "libraries", "glibc", "load", "environment"):
        assert results[check_id].status == SKIP
        assert "see sdk.selection" in results[check_id].detail


def test_selection_reasons(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    (Path.cwd() / ".qnn-version").write_text(OTHER_VERSION + "\n")
    assert doctor()["sdk.selection"].detail.startswith(f"pinned in {Path.cwd() / '.qnn-version'}")
    root = sdk_tree(tmp_path)
    monkeypatch.setenv("QNN_SDK_ROOT", str(root))
    assert doctor()["sdk.selection"].detail.startswith("from QNN_SDK_ROOT")


def test_an_empty_qnn_sdk_root_checks_ld_library_path_as_it_is(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    root = sdk_tree(tmp_path)
    monkeypatch.setenv("QNN_SDK_ROOT", "")
    results = doctor()
    assert results["sdk.selection"].status == OK
    assert "the caller manages the SDK" in results["sdk.selection"].detail
    assert results["sdk.layout"].status == SKIP
    assert results["libraries"].status == SKIP
    assert "LD_LIBRARY_PATH" in (results["libraries"].hint or "")
    # The load runs with the environment as it is, and the loader says what is wrong.
    assert results["load"].status == FAIL
    assert "libQnnHtp.so cannot be found: no folder on the loader's path holds it" in results["load"].detail
    assert results["environment"].status == WARN

    monkeypatch.setenv("LD_LIBRARY_PATH", str(root / HOST_LIB_DIR))
    results = doctor()
    assert results["libraries"].status == OK
    assert results["load"].status == OK
    assert results["environment"].status == OK
    assert str(root / HOST_LIB_DIR) in results["sdk.selection"].detail


def test_version_from_sdk_yaml_or_folder_name(tmp_path: Path) -> None:
    with_yaml = sdk_tree(tmp_path / "a")
    no_build = "its libraries carry no build id"
    assert doctor(str(with_yaml))["sdk.version"].detail == f"{VERSION} (from sdk.yaml; {no_build})"
    named = sdk_tree(tmp_path / "b", sdk_yaml=False)
    assert doctor(str(named))["sdk.version"].detail == f"{VERSION} (from the folder name; {no_build})"
    anonymous = build_sdk_tree(tmp_path / "c" / "sdk", SdkSpec(sdk_yaml=False))
    result = doctor(str(anonymous))["sdk.version"]
    assert result.status == WARN
    assert "cannot tell the version" in result.detail


def test_version_is_the_libraries_build_and_every_label_must_agree(tmp_path: Path) -> None:
    agreeing = sdk_tree(tmp_path / "a", build_id=f"v{VERSION}093015")
    version = doctor(str(agreeing))["sdk.version"]
    assert version.status == OK, version
    assert version.detail == f"{VERSION}: its libraries are build {VERSION}093015, as sdk.yaml and the folder name say"
    # Named and described as 2.37, built as 2.51: the libraries are what loads.
    mislabelled = sdk_tree(tmp_path / "b", build_id="v2.51.0.260929181845")
    version = doctor(str(mislabelled))["sdk.version"]
    assert version.status == FAIL
    assert version.detail.startswith("its libraries are build 2.51.0.260929181845 (SDK 2.51.0.260929), but "
                                     f"sdk.yaml says {VERSION} and the folder name says {VERSION}")


def test_executorch_is_compared_with_the_libraries_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = make_executorch(tmp_path / "site", "1.5.1", VERSION)
    monkeypatch.syspath_prepend(str(site))
    mislabelled = sdk_tree(tmp_path, build_id="v2.51.0.260929181845")
    check = doctor(str(mislabelled))["executorch"]
    assert check.status == FAIL
    assert "the selected SDK is 2.51.0.260929" in check.detail
    assert "error 14001" in check.detail


def test_manifest_and_verify(tmp_path: Path, cache_dir: Path) -> None:
    from qnnctl.install.pipeline import InstallRequest, install

    archive = build_archive(tmp_path, "zip")
    installed = install(InstallRequest(file=archive), Cache(cache_dir), dict(os.environ), Path.cwd(),
                        vouchers(os.environ, Path.cwd()))
    assert installed.sdk is not None
    root = installed.sdk.root
    results = doctor(VERSION)
    assert results["sdk.manifest"].status == OK
    assert results["sdk.verify"].status == SKIP
    assert results["sdk.verify"].hint == "`qnnctl doctor --verify` checks them"
    verified = doctor(VERSION, verify=True)["sdk.verify"]
    assert verified.status == OK
    assert verified.detail.startswith("all ")

    (root / "QNN_README.txt").write_text("changed\n")
    (root / HOST_BIN_DIR / "qnn-context-binary-generator").unlink()
    verified = doctor(VERSION, verify=True)["sdk.verify"]
    assert verified.status == FAIL
    assert "1 changed (QNN_README.txt)" in verified.detail
    assert f"1 missing ({HOST_BIN_DIR}/qnn-context-binary-generator)" in verified.detail
    # Installed from a file: the fix reads that file again rather than download from Qualcomm.
    assert verified.hint == f"reinstall it: `qnnctl install --force --file {archive}`"
    archive.unlink()
    gone = doctor(VERSION, verify=True)["sdk.verify"]
    assert gone.hint == ("reinstall it from its archive: `qnnctl install --force --file ARCHIVE` "
                         f"(it was installed from {archive}, which is gone)")


def test_verify_compares_sha256s_and_crc32s_only_where_an_earlier_manifest_has_nothing_else(
        tmp_path: Path, cache_dir: Path) -> None:
    """New manifests record each file's sha256, which a change that keeps the CRC-32 (four
    chosen bytes) does not get past; manifests of earlier versions hold CRC-32s, still read,
    and --verify says which it compared."""
    import zlib

    from qnnctl.install.memberdata import crc32_digest
    from qnnctl.install.pipeline import InstallRequest, install
    from qnnctl.sdk.cache import MANIFEST_NAME, read_manifest
    from tests.forge import keep_crc32

    installed = install(InstallRequest(file=build_archive(tmp_path, "zip")), Cache(cache_dir),
                        dict(os.environ), Path.cwd(), vouchers(os.environ, Path.cwd()))
    assert installed.sdk is not None
    root = installed.sdk.root
    manifest = read_manifest(root)
    assert manifest is not None
    assert all(len(str(digest)) == 64 for digest in manifest["files"].values())
    verified = doctor(VERSION, verify=True)["sdk.verify"]
    assert (verified.status, verified.detail.endswith("(by sha256)")) == (OK, True), verified.detail

    readme = root / "QNN_README.txt"
    original = readme.read_bytes()
    forged = keep_crc32(b"trojan" + original[6:], len(original) - 4, zlib.crc32(original))
    assert (zlib.crc32(forged), len(forged)) == (zlib.crc32(original), len(original))
    readme.write_bytes(forged)
    verified = doctor(VERSION, verify=True)["sdk.verify"]
    assert verified.status == FAIL
    assert "1 changed (QNN_README.txt)" in verified.detail

    # An earlier manifest: CRC-32s, which that change gets past, as --verify says.
    manifest["files"] = {rel: crc32_digest(zlib.crc32((root / rel).read_bytes())) for rel in manifest["files"]}
    manifest["files"]["QNN_README.txt"] = crc32_digest(zlib.crc32(original))
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    verified = doctor(VERSION, verify=True)["sdk.verify"]
    assert verified.status == OK
    # All CRC-32s: said alone, not as the mixed manifest's "by sha256, some by CRC-32 only".
    assert verified.detail.endswith("(by CRC-32 only: recorded by an earlier qnnctl; reinstall for sha256s)")
    readme.write_bytes(bytes(reversed(original)))  # same size, another CRC-32
    assert doctor(VERSION, verify=True)["sdk.verify"].status == FAIL


def test_a_manifest_naming_another_version_warns(tmp_path: Path, cache_dir: Path) -> None:
    from qnnctl.install.pipeline import InstallRequest, install
    from qnnctl.sdk.cache import MANIFEST_NAME, read_manifest

    installed = install(InstallRequest(file=build_archive(tmp_path, "zip")), Cache(cache_dir),
                        dict(os.environ), Path.cwd(), vouchers(os.environ, Path.cwd()))
    assert installed.sdk is not None
    root = installed.sdk.root
    manifest = read_manifest(root)
    assert manifest is not None
    assert doctor(VERSION)["sdk.manifest"].status == OK
    (root / MANIFEST_NAME).write_text(json.dumps({**manifest, "version": OTHER_VERSION}))
    check = doctor(VERSION)["sdk.manifest"]
    assert check.status == WARN
    assert check.detail.endswith(f"; it names version {OTHER_VERSION}, not {VERSION}")
    assert check.hint is not None
    assert "reinstall it" in check.hint


def test_manifest_without_digests_warns(cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir)  # its manifest records no files
    results = doctor()
    assert results["sdk.manifest"].status == WARN
    assert "no per-file digests" in results["sdk.manifest"].detail
    assert results["sdk.verify"].status == SKIP


def test_environment_check(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = sdk_tree(tmp_path)
    other = sdk_tree(tmp_path / "other", OTHER_VERSION)
    result = doctor(str(root))["environment"]
    assert result.status == WARN
    assert "QNN_SDK_ROOT is not set" in result.detail
    assert f"LD_LIBRARY_PATH lacks {root / HOST_LIB_DIR}" in result.detail
    assert result.hint is not None
    assert result.hint.startswith(f'eval "$(qnnctl env --sdk {root})"')

    def export(sdk_root: Path, version: str) -> None:
        sdk = Sdk(sdk_root, version, "--sdk")
        for name, value in environment_for(sdk, dict(os.environ), Cache(cache_dir), True).items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)

    export(other, OTHER_VERSION)
    result = doctor(str(root))["environment"]
    assert result.status == WARN
    assert f"QNN_SDK_ROOT is {other}" in result.detail
    export(root, VERSION)
    assert doctor(str(root))["environment"].status == OK


def test_executorch_expectation_that_does_not_match(tmp_path: Path) -> None:
    site = make_executorch(tmp_path / "site", "1.5.1", OTHER_VERSION)
    root = sdk_tree(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(site))
    result = run_qnnctl("doctor", "--sdk", str(root), "--json", "--offline", env=env)
    assert result.returncode == 0, result.stdout
    checks = {c["id"]: c for c in json.loads(result.stdout)["checks"]}
    executorch = checks["executorch"]
    # Another minor version, with no known failure on record: a warning saying what can go wrong.
    assert executorch["status"] == "warn"
    assert "context binaries are tied to the build that made them" in executorch["detail"]
    assert f"ExecuTorch 1.5.1 ({site / 'executorch'}) expects SDK {OTHER_VERSION}" in executorch["detail"]
    assert f"the selected SDK is {VERSION}" in executorch["detail"]
    assert f"`qnnctl install {OTHER_VERSION}`" in executorch["hint"]
    # Read from its files: the package itself raises when imported.
    assert "imported" not in result.stdout + result.stderr


def test_executorch_expectation_that_matches(tmp_path: Path, cache_dir: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    site = make_executorch(tmp_path / "site", "1.5.1", VERSION)
    monkeypatch.syspath_prepend(str(site))
    install_tree_into_cache(cache_dir)
    results = doctor()
    assert results["sdk.selection"].detail.startswith("executorch: ")
    # The SDK it expects; on that one (2.37) its passes that need a newer one fall back silently.
    assert results["executorch"].status == WARN
    assert results["executorch"].detail.startswith(f"ExecuTorch 1.5.1 ({site / 'executorch'}) expects SDK {VERSION}; "
                                                   f"the selected SDK is {VERSION}, on which its passes that need a "
                                                   "newer one fall back without a word: Hadamard recomposition from "
                                                   "QAIRT 2.47, an embedding op builder from QAIRT 2.48 (source: ")
    assert "executorch" not in sys.modules


def test_executorch_not_installed_is_skipped() -> None:
    assert doctor()["executorch"].status == SKIP


# libQnnHtp.so's provider list with another core API version than sdkfactory's (2.40.0).
HTP_PROVIDER_WITH_CORE = """
#include <stdint.h>
typedef struct {{ uint32_t major, minor, patch; }} ApiVersion;
typedef struct {{ uint32_t backendId; const char *providerName; ApiVersion core, backend; }} Provider;
static const Provider provider = {{ 6, "HTP_QTI_AISW", {{ {major}, {minor}, 0 }}, {{5, 47, 0}} }};
static const Provider *providers[] = {{ &provider }};
uint64_t QnnInterface_getProviders(const Provider ***list, uint32_t *count) {{
    *list = providers;
    *count = 1;
    return 0;
}}
"""


def onnxruntime_qnn_site(site: Path, version: str, core: str | None = "1.32.0") -> Path:
    """A site-packages folder that holds onnxruntime-qnn's dist-info and, unless `core` is None,
    onnxruntime's (which is all doctor reads)."""
    for name, release in (("onnxruntime_qnn", version), ("onnxruntime", core)):
        if release is None:
            continue
        dist = site / f"{name}-{release}.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {release}\n")
        (dist / "RECORD").write_text("")
    return site


def onnxruntime_check(root: Path, site: Path | None) -> dict[str, str]:
    env = dict(os.environ, **({"PYTHONPATH": str(site)} if site else {}))
    result = run_qnnctl("doctor", "--sdk", str(root), "--json", "--offline", env=env)
    checks: dict[str, dict[str, str]] = {c["id"]: c for c in json.loads(result.stdout)["checks"]}
    return checks["onnxruntime"]


def test_onnxruntime_qnn_against_the_sdk_htp_api(tmp_path: Path) -> None:
    root = sdk_tree(tmp_path)
    assert onnxruntime_check(root, None)["status"] == "skip"
    site = onnxruntime_qnn_site(tmp_path / "site", "2.7.0")
    # sdkfactory's libQnnHtp.so offers core API 2.40.0, what 2.7.0 needs.
    found = onnxruntime_check(root, site)
    assert found["status"] == "ok", found
    assert found["detail"] == ("onnxruntime-qnn 2.7.0 needs QNN core API 2.40 (QAIRT 2.51); the selected SDK's "
                               "libQnnHtp.so offers core API 2.40.0 (it carries QAIRT 2.51.0, with onnxruntime 1.32.0)")
    # The core onnxruntime it is a plugin of: missing, or older than its METADATA asks.
    for core, says in ((None, "onnxruntime-qnn 2.7.0 is a plugin of onnxruntime (>= 1.24.2), which "),
                       ("1.20.1", "onnxruntime-qnn 2.7.0 needs onnxruntime >= 1.24.2, ")):
        lacking = onnxruntime_check(root, onnxruntime_qnn_site(tmp_path / f"site-{core}", "2.7.0", core))
        assert lacking["status"] == "warn"
        assert lacking["detail"].startswith(says), lacking
    # QAIRT 2.47's libQnnHtp.so offers 2.36.0.
    compile_shared(root / HOST_LIB_DIR / "libQnnHtp.so", HTP_PROVIDER_WITH_CORE.format(major=2, minor=36),
                   providers=False)
    older = onnxruntime_check(root, site)
    assert older["status"] == "warn"
    assert older["detail"].startswith("onnxruntime-qnn 2.7.0 needs QNN core API 2.40 (QAIRT 2.51), the selected "
                                      "SDK's libQnnHtp.so offers core API 2.36.0: it stops at `Unable to find a "
                                      "valid interface` unless the provider option `skip_qnn_version_check`")
    assert "(seen 2026-12-04: onnxruntime-qnn 2.7.0 with onnxruntime 1.32.0" in older["detail"]
    assert older["hint"] == ("`qnnctl install 2.51` and lower with it, or give the provider option "
                             "skip_qnn_version_check=\"1\"")
    # A release with no known requirement, and an SDK that does not load.
    assert onnxruntime_check(root, onnxruntime_qnn_site(tmp_path / "site-2.3", "2.3.0"))["detail"] == (
        "onnxruntime-qnn 2.3.0: no known requirement of the SDK's QNN API version")
    (root / HOST_LIB_DIR / "libQnnHtp.so").write_bytes(b"not a library")
    broken = onnxruntime_check(root, site)
    assert broken["status"] == "warn"
    assert "did not load, so its API version is unknown" in broken["detail"]


def make_executorch(site: Path, version: str, expects: str) -> Path:
    """A site-packages folder laid out like the installed ExecuTorch wheel."""
    package = site / "executorch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('executorch was imported')\n")
    scripts = package / "backends" / "qualcomm" / "scripts"
    scripts.mkdir(parents=True)
    for folder in (package / "backends", package / "backends" / "qualcomm", scripts):
        (folder / "__init__.py").write_text("")
    (scripts / "download_qnn_sdk.py").write_text(
        "import os\n\n"
        f'QNN_VERSION = os.environ.get("QNN_VERSION", "{expects}")\n'
        'QAIRT_URL = f"https://softwarecenter.qualcomm.com/.../All/{QNN_VERSION}/v{QNN_VERSION}.zip"\n'
    )
    dist = site / f"executorch-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: executorch\nVersion: {version}\n")
    (dist / "RECORD").write_text("")
    return site


def test_checks_that_raise_do_not_stop_the_rest() -> None:
    def boom(ctx: Context) -> Outcome:
        raise RuntimeError("kaboom")

    def refuses(ctx: Context) -> Outcome:
        raise QnnctlError("no good", hint="do this")

    def skips(ctx: Context) -> Outcome:
        raise Skip("nothing here")

    def multiline(ctx: Context) -> Outcome:
        return Outcome(WARN, "one\ntwo", "fix\nit")

    checks = [("boom", boom), CHECKS[0], ("refuses", refuses), ("skips", skips), ("multiline", multiline)]
    ctx = Context(spec=None, environ=dict(os.environ), cwd=Path.cwd(), offline=True)
    results = run_checks(ctx, checks)
    assert [r.id for r in results] == ["boom", "host", "refuses", "skips", "multiline"]
    assert results[0].status == FAIL
    assert "RuntimeError: kaboom" in results[0].detail
    assert results[0].hint is not None
    assert "-vv" in results[0].hint
    assert results[1].status == OK
    assert (results[2].status, results[2].detail, results[2].hint) == (FAIL, "no good", "do this")
    assert (results[3].status, results[3].detail) == (SKIP, "nothing here")
    assert (results[4].detail, results[4].hint) == ("one two", "fix it")


def test_unsupported_host_fails_and_names_the_supported_one() -> None:
    ctx = Context(spec=None, environ=dict(os.environ), cwd=Path.cwd(), offline=True, system="Darwin",
                  machine="arm64")
    [result] = run_checks(ctx, [CHECKS[0]])
    assert result.status == FAIL
    assert "Darwin arm64" in result.detail
    assert "Linux x86_64" in result.detail


def test_exit_codes() -> None:
    def results(*statuses: str) -> list[Result]:
        return [Result(f"c{i}", s, "d") for i, s in enumerate(statuses)]

    assert exit_code(results(OK, SKIP)) == 0
    assert exit_code(results(OK, WARN)) == 0
    assert exit_code(results(OK, WARN), strict=True) == 1
    assert exit_code(results(OK, FAIL)) == 1
    assert json.loads(render_json(results(OK, WARN), strict=True))["ok"] is False
    assert json.loads(render_json(results(OK, WARN)))["ok"] is True


def test_a_malformed_sdk_argument_is_a_usage_error() -> None:
    result = run_qnnctl("doctor", "--sdk", "", "--offline")
    assert result.returncode == 2
    assert result.stdout == ""


def test_text_table_and_json_come_from_the_same_results() -> None:
    results = [Result("host", OK, "Linux x86_64"), Result("libraries", FAIL, "libc++.so.1 not found", "apt-get it"),
               Result("network", SKIP, "--offline")]
    text = render_text(results)
    assert text.splitlines() == [
        "ok    host       Linux x86_64",
        "fail  libraries  libc++.so.1 not found",
        "                 hint: apt-get it",
        "skip  network    --offline",
        "1 failed, 1 ok, 1 skipped",
    ]
    table = render_table(results, width=100)
    assert "\x1b[" in table
    for r in results:
        assert r.id in table
        assert r.detail in table
    assert "hint: apt-get it" in table
    assert [c["status"] for c in json.loads(render_json(results))["checks"]] == [OK, FAIL, SKIP]


def test_the_summary_counts_in_words() -> None:
    """`1 warning`, `2 warnings`: no `warning(s)`."""

    def of(*statuses: str) -> str:
        return summary([Result(f"c{i}", s, "") for i, s in enumerate(statuses)])

    assert of(OK, WARN) == "1 warning, 1 ok"
    assert of(WARN, WARN, FAIL, SKIP, OK, OK) == "1 failed, 2 warnings, 2 ok, 1 skipped"
    from qnnctl.words import plural

    assert [plural(n, "SDK") for n in (0, 1, 2)] == ["0 SDKs", "1 SDK", "2 SDKs"]
    assert plural(3, "more file or link", "more files or links") == "3 more files or links"


def test_a_terminal_gets_the_table(tmp_path: Path) -> None:
    root = sdk_tree(tmp_path)
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "qnnctl", "doctor", "--sdk", str(root), "--offline"],
                            stdout=follower, stderr=subprocess.PIPE, env=dict(os.environ, COLUMNS="200"))
    os.close(follower)
    out = read_terminal(leader).decode()
    assert proc.wait(timeout=120) == 0
    assert proc.stderr is not None
    proc.stderr.close()
    assert "\x1b[" in out  # colours: rich, not the plain text
    assert "sdk.selection" in out
    assert "libraries" in out


def test_the_report_shows_an_ok_checks_hint_piped_and_on_a_terminal(cache_dir: Path) -> None:
    """An SDK chosen only because it is the newest installed: `qnnctl use VERSION`, as the
    README promises, in the text and the table alike, not only in --json."""
    install_tree_into_cache(cache_dir)
    pin = f"`qnnctl use {VERSION}`"
    piped = run_qnnctl("doctor", "--offline")
    lines = piped.stdout.splitlines()
    [at] = [i for i, line in enumerate(lines) if line.startswith("ok    sdk.selection")]
    assert lines[at + 1].strip() == f"hint: pin it for this project so that it stays the choice: {pin}", piped.stdout
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "qnnctl", "doctor", "--offline"],
                            stdout=follower, stderr=subprocess.DEVNULL, env=dict(os.environ, COLUMNS="300"))
    os.close(follower)
    table = re.sub(r"\x1b\[[0-9;]*m", "", read_terminal(leader).decode())
    proc.wait(timeout=120)
    assert pin in table, table


# -- cpu, cache, network ---------------------------------------------------------------------


def test_cpu_on_amd_notes_mkldnn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("QNNCTL_FORCE_CPU_VENDOR")
    ctx = Context(spec=None, environ=dict(os.environ), cwd=Path.cwd(), offline=True)
    cpu = [c for c in CHECKS if c[0] == "cpu"]
    # Seed the once-per-process cache in place of /proc/cpuinfo's answer.
    monkeypatch.setattr(host, "_vendor", ["AuthenticAMD"])
    [result] = run_checks(ctx, cpu)
    assert result.status == OK
    assert "turns PyTorch's MKLDNN off" in result.detail
    monkeypatch.setattr(host, "_vendor", ["GenuineIntel"])
    [result] = run_checks(ctx, cpu)
    assert (result.status, result.detail) == (OK, "GenuineIntel")
    monkeypatch.setenv("QNNCTL_FORCE_CPU_VENDOR", "AuthenticAMD")
    [result] = run_checks(Context(spec=None, environ=dict(os.environ), cwd=Path.cwd()), cpu)
    assert result.detail.startswith("AuthenticAMD (from QNNCTL_FORCE_CPU_VENDOR): `qnnctl lower` turns")
    monkeypatch.delenv("QNNCTL_FORCE_CPU_VENDOR")
    # Read from /proc/cpuinfo, as the guard reads it: an AMD host's text.
    monkeypatch.setattr(host, "_vendor", [])
    monkeypatch.setattr(host, "CPUINFO", str(write_cpuinfo(tmp_path / "amd", AMD_CPUINFO)))
    [result] = run_checks(ctx, cpu)
    assert (result.status, result.detail.split(":")[0]) == (OK, "AuthenticAMD")
    assert "turns PyTorch's MKLDNN off" in result.detail
    # A file that names no vendor: said so, and the guard stays off.
    monkeypatch.setattr(host, "_vendor", [])
    monkeypatch.setattr(host, "CPUINFO", str(write_cpuinfo(tmp_path / "none", "processor\t: 0\n")))
    [result] = run_checks(ctx, cpu)
    assert result.status == WARN
    assert "names no CPU vendor" in result.detail
    # No /proc/cpuinfo and no py-cpuinfo.
    monkeypatch.setattr(host, "_vendor", [])
    monkeypatch.setattr(host, "CPUINFO", str(tmp_path / "no-proc" / "cpuinfo"))
    monkeypatch.setitem(sys.modules, "cpuinfo", None)  # makes `import cpuinfo` fail as if missing
    [result] = run_checks(ctx, cpu)
    assert result.status == WARN
    assert "py-cpuinfo is not installed" in result.detail
    assert result.hint == "pip install py-cpuinfo"


def test_cache_check(cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = [c for c in CHECKS if c[0] == "cache"]

    def check(space: int = 0) -> Result:
        ctx = Context(spec=None, environ=dict(os.environ), cwd=Path.cwd(), offline=True, space_needed=space)
        return run_checks(ctx, cache)[0]

    result = check()
    assert result.status == OK
    assert "not created yet" in result.detail
    downloads = cache_dir / "downloads"
    downloads.mkdir(parents=True)
    (downloads / f"v{VERSION}.zip.part").write_bytes(b"x" * 1000)
    result = check()
    assert result.status == WARN
    assert "1 partial download (" in result.detail
    assert result.hint is not None
    assert "`qnnctl cache clean`" in result.hint
    (downloads / f"v{VERSION}.zip.part").unlink()
    assert check().status == OK
    result = check(space=1 << 60)
    assert result.status == WARN
    assert "an SDK install needs about" in result.detail
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(blocker / "cache"))
    result = check()
    assert result.status == FAIL
    assert "is not a folder" in result.detail


def test_offline_skips_the_network(server: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    assert doctor(offline=True)["network"].status == SKIP
    assert server.requests == []


def test_network_reaches_the_mirror(server: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    path = f"/{VERSION}/v{VERSION}.zip"
    server.add(path, b"PK\x05\x06" + b"\0" * 18)
    result = doctor(offline=False)["network"]
    assert result.status == OK, result
    assert f"answered HTTP 200 for {server.base}{path}, directly: NO_PROXY=" in result.detail
    assert len(server.requests_for(path, method="HEAD")) == 1
    server.files.clear()
    result = doctor(offline=False)["network"]
    assert result.status == WARN
    assert "HTTP 404" in result.detail


def test_network_unreachable_fails_only_when_an_install_is_needed(cache_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("QNNCTL_MIRROR", f"http://127.0.0.1:{port}")
    result = doctor(offline=False)["network"]
    assert result.status == FAIL
    assert "cannot reach the mirror (QNNCTL_MIRROR)" in result.detail
    assert result.hint == "check the host and port of QNNCTL_MIRROR"  # not "set QNNCTL_MIRROR": it is set
    install_tree_into_cache(cache_dir)
    result = doctor(offline=False)["network"]
    assert result.status == WARN
    assert "already installed" in result.detail


def test_network_goes_through_the_proxy_and_hides_its_password(server: FaultServer,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    host_port = server.base.removeprefix("http://")
    monkeypatch.setenv("QNNCTL_MIRROR", "http://mirror.invalid/All")
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setenv("HTTP_PROXY", f"http://user:s3cret@{host_port}")
    monkeypatch.delenv("NO_PROXY")
    result = doctor(offline=False)["network"]
    assert f"through proxy http://***@{host_port} (from HTTP_PROXY)" in result.detail
    assert "s3cret" not in result.detail
    proxied = [r for r in server.requests if r.path == f"http://mirror.invalid/All/{VERSION}/v{VERSION}.zip"]
    assert len(proxied) == 1
    assert "Proxy-Authorization" in proxied[0].headers

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    result = doctor(offline=False)["network"]
    assert "directly: NO_PROXY=127.0.0.1 covers it (HTTP_PROXY set)" in result.detail
    monkeypatch.delenv("NO_PROXY")
    monkeypatch.delenv("HTTP_PROXY")
    monkeypatch.setenv("HTTPS_PROXY", f"http://{host_port}")
    result = doctor(offline=False)["network"]
    assert "directly (HTTPS_PROXY set, none for http)" in result.detail
    monkeypatch.setenv("ALL_PROXY", f"http://{host_port}")
    result = doctor(offline=False)["network"]
    assert f"through proxy http://{host_port} (from HTTPS_PROXY, ALL_PROXY)" in result.detail


# -- load: what the libraries offer, whatever they print ------------------------------------------

# What QAIRT 2.51's libQnnHtp.so prints to stdout while it loads. C's stdout buffer reaches a
# pipe when the process exits, after anything the loading Python wrote.
NOISY_CONSTRUCTOR = r"""
#include <stdio.h>
__attribute__((constructor)) static void noisy(void) {
    printf(" # LIBNATIVE: No alternate configuration present in libnative_tls.conf\n{\"libQnnHtp.so\": 1}\n");
}
"""


def test_load_reports_providers_whatever_the_libraries_print(tmp_path: Path) -> None:
    root = sdk_tree(tmp_path)
    compile_shared(root / HOST_LIB_DIR / "libQnnHtp.so", NOISY_CONSTRUCTOR)
    results = doctor(str(root))
    load = results["load"]
    assert load.status == OK, load
    assert "libQnnHtp.so: HTP_QTI_AISW (backend 6, core API 2.40.0, backend API 5.51.0)" in load.detail
    assert "libQnnSystem.so: SYSTEM_QTI_AISW (system API 2.40.0)" in load.detail


def test_load_fails_a_library_that_offers_no_providers(tmp_path: Path) -> None:
    root = sdk_tree(tmp_path)
    compile_shared(root / HOST_LIB_DIR / "libQnnHtp.so", "int qnn_htp(void) { return 1; }\n", providers=False)
    load = doctor(str(root))["load"]
    assert load.status == FAIL
    assert "libQnnHtp.so loads but exports no QnnInterface_getProviders" in load.detail


def test_load_fails_an_htp_library_without_an_htp_provider(tmp_path: Path) -> None:
    root = sdk_tree(tmp_path)
    # libQnnCpu.so's provider (backend 3) under libQnnHtp.so's name.
    shutil.copyfile(root / HOST_LIB_DIR / "libQnnCpu.so", root / HOST_LIB_DIR / "libQnnHtp.so")
    load = doctor(str(root))["load"]
    assert load.status == FAIL
    assert "libQnnHtp.so offers no HTP provider (backend 6)" in load.detail
    assert "CPU_QTI_AISW (backend 3" in load.detail


def test_layout_of_host_libraries_alone_is_usable_for_lowering_and_says_what_it_lacks(tmp_path: Path) -> None:
    root = sdk_tree(tmp_path)
    shutil.rmtree(root / "include")
    shutil.rmtree(root / HOST_BIN_DIR)
    layout = doctor(str(root))["sdk.layout"]
    assert layout.status == OK, layout
    assert "enough for lowering with ExecuTorch's Python flow" in layout.detail
    assert f"no {HOST_BIN_DIR} (no qnn-net-run" in layout.detail
    assert "no include/QNN (nothing to compile native code against)" in layout.detail
    # Without the host libraries it is no SDK for lowering at all.
    (root / HOST_LIB_DIR / "libQnnSystem.so").unlink()
    assert doctor(str(root))["sdk.layout"].status == FAIL


# -- the cache and the network, as a shared cache and a TLS-inspecting network see them ----


def _cache_check() -> Result:
    ctx = Context(spec=None, environ=dict(os.environ), cwd=Path.cwd(), offline=True, space_needed=0)
    return run_checks(ctx, [c for c in CHECKS if c[0] == "cache"])[0]


def test_cache_check_counts_records_of_downloads_that_did_not_finish(cache_dir: Path) -> None:
    downloads = cache_dir / "downloads"
    downloads.mkdir(parents=True)
    (downloads / f"v{VERSION}.zip.json").write_text("{}")  # what an HTML error page left
    result = _cache_check()
    assert result.status == WARN
    assert f"1 record of downloads that did not finish (v{VERSION}.zip.json)" in result.detail
    assert "`qnnctl cache clean`" in (result.hint or "")
    assert run_qnnctl("cache", "clean").returncode == 0
    assert _cache_check().status == OK


def test_a_read_only_shared_cache_is_a_warning_that_says_what_cannot_be_done(tmp_path: Path) -> None:
    """A cache filled by its owner and read by others: env and lower use it, so doctor does
    not fail on it; it says that installs cannot go there."""
    # As root, the reader is another user (root may write anywhere); its folders must then
    # be reachable by that user, which tmp_path (under a 0700 folder) is not.
    as_root = os.geteuid() == 0
    prefix = [require_tool("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups"] if as_root else []
    shared = Path(tempfile.mkdtemp(prefix="qnnctl-shared-")) if as_root else tmp_path / "shared"
    try:
        shared.chmod(0o755)
        cache, home, work = shared / "cache", shared / "home", shared / "work"
        for folder in (home, work):
            folder.mkdir(parents=True)
            folder.chmod(0o777)
        install_tree_into_cache(cache)
        if not as_root:
            for path in [cache, *cache.rglob("*")]:
                if path.is_dir() and not path.is_symlink():
                    path.chmod(0o555)
        env = dict(os.environ, QNNCTL_CACHE_DIR=str(cache), HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))

        def reader(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*prefix, sys.executable, "-m", "qnnctl", *args], env=env, cwd=work,
                                  capture_output=True, text=True, timeout=120)

        assert reader("env", "--shell", "json").returncode == 0
        result = reader("doctor", "--json", "--offline")
        checks = {c["id"]: c for c in json.loads(result.stdout)["checks"]}
        assert checks["cache"]["status"] == "warn", checks["cache"]
        assert checks["cache"]["detail"].startswith(f"{cache}: read-only for you (1 SDK: env, lower and doctor use "
                                                    "them); install, uninstall, `cache clean` and staging a "
                                                    "runtime cannot write here")
        assert "QNNCTL_CACHE_DIR" in checks["cache"]["hint"]
        failed = [c for c in checks.values() if c["status"] == "fail"]
        assert not [c for c in failed if str(cache) in c["detail"]], failed
        if not as_root:  # another user may lack the right to run this Python (a load check)
            assert result.returncode == 0, failed  # it failed the whole report
    finally:
        if as_root:
            shutil.rmtree(shared)
        else:
            for path in [shared, *shared.rglob("*")]:
                if path.is_dir() and not path.is_symlink():
                    path.chmod(0o755)


def test_network_check_gives_a_certificate_failure_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_tool("openssl")
    with FaultServer(tls=self_signed_certificate(tmp_path / "tls")) as server:
        monkeypatch.setenv("QNNCTL_MIRROR", server.base)
        result = doctor(offline=False)["network"]
    assert result.status == FAIL
    assert result.detail.startswith(f"TLS to the mirror (QNNCTL_MIRROR) {server.base}/{VERSION}/v{VERSION}.zip failed")
    assert re.search(r": the server's certificate is not trusted: \[SSL: CERTIFICATE_VERIFY_FAILED\] certificate "
                     r"verify failed: self[- ]signed certificate \(_ssl\.c:\d+\)$", result.detail), result.detail
    assert "REQUESTS_CA_BUNDLE" in (result.hint or "")


def test_doctor_python_checks_the_frameworks_of_that_python(tmp_path: Path) -> None:
    """`--python PY`: the Python `lower --python` runs, asked in a process of its own; qnnctl's own
    Python has no onnxruntime-qnn."""
    root = sdk_tree(tmp_path)
    other = tmp_path / "other"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True, timeout=120)
    python = other / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    onnxruntime_qnn_site(Path(purelib), "2.7.0", "1.20.1")
    own = run_qnnctl("doctor", "--sdk", str(root), "--json", "--offline")
    assert {c["id"]: c for c in json.loads(own.stdout)["checks"]}["onnxruntime"]["status"] == "skip"
    proc = run_qnnctl("doctor", "--sdk", str(root), "--json", "--offline", "--python", str(python))
    found = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert found["onnxruntime"]["status"] == "warn"
    assert found["onnxruntime"]["detail"].startswith(f"onnxruntime-qnn 2.7.0 needs onnxruntime >= 1.24.2, {python} "
                                                     "has 1.20.1")
    assert found["executorch"]["detail"] == f"ExecuTorch is not installed for {python}"
    broken = run_qnnctl("doctor", "--sdk", str(root), "--json", "--offline", "--python", str(tmp_path / "nothing"))
    assert broken.returncode == 1
    failed = {c["id"]: c for c in json.loads(broken.stdout)["checks"]}
    for check in ("executorch", "onnxruntime"):
        assert failed[check]["status"] == "fail"
        assert failed[check]["detail"].startswith(f"cannot run {tmp_path / 'nothing'}: "), failed[check]
