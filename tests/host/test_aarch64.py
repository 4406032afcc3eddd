"""A Linux aarch64 host, on this x86_64 one: the machine taken as aarch64 (QNNCTL_FORCE_MACHINE),
synthetic SDKs whose aarch64 libraries are real ELF files marked AArch64, needing GLIBCXX_3.4.29
of libstdc++.so.6 and libatomic.so.1 as QAIRT 2.51's do (tests/sdkfactory.py). What is proven
here: the layout, the components by parts from a loopback mirror, env, doctor's ELF, GLIBCXX and
libatomic checks, and the refusals. Loading the libraries needs an aarch64 machine.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

from qnnctl.errors import InvalidSdkError, NoHostLibrariesError
from qnnctl.install.confine import member_path, sdk_top
from qnnctl.run.api import amd_guard_needed
from qnnctl.sdk.hosts import FORCE_MACHINE_VARIABLE, HOSTS, host_for, this_host, this_system
from qnnctl.sdk.layout import HOST_LIB_DIR, sdk_from_root
from qnnctl.sdk.members import component_of, tree_digests
from tests.conftest import run_qnnctl
from tests.httpserver import FaultServer
from tests.sdkfactory import (
    AARCH64_BIN_DIR,
    AARCH64_LIB_DIR,
    VERSION,
    aarch64_system,
    add_aarch64_host,
    build_sdk_tree,
    build_two_host_archive,
)

AARCH64 = {FORCE_MACHINE_VARIABLE: "aarch64"}


def aarch64_env(**more: str) -> dict[str, str]:
    return {**os.environ, **AARCH64, **more}


@pytest.fixture
def aarch64_sdk(tmp_path: Path) -> Path:
    """An SDK root with the aarch64 host's folders alone (as an SDK installed by parts there)."""
    root = build_sdk_tree(tmp_path / "sdk" / VERSION)
    add_aarch64_host(root, tmp_path)
    for folder in (HOST_LIB_DIR, "bin/x86_64-linux-clang"):
        for path in (root / folder).iterdir():
            path.unlink()
        (root / folder).rmdir()
    return root


# -- the table ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("forced", "machine"), [("aarch64", "aarch64"), ("arm64", "aarch64"), ("AMD64", "x86_64"),
                                                 ("Darwin/arm64", "aarch64")])
def test_the_machine_comes_from_one_place(monkeypatch: pytest.MonkeyPatch, forced: str, machine: str) -> None:
    monkeypatch.setenv(FORCE_MACHINE_VARIABLE, forced)
    assert this_system()[1] == machine
    assert this_system()[0] == ("Darwin" if "/" in forced else "Linux")


def test_each_host_has_its_folders_and_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    assert this_host().lib_dir == "lib/x86_64-linux-clang"  # this machine
    monkeypatch.setenv(FORCE_MACHINE_VARIABLE, "aarch64")
    host = this_host()
    assert (host.lib_dir, host.bin_dir, host.elf_machine) == (AARCH64_LIB_DIR, AARCH64_BIN_DIR, 183)
    assert host.cxx_libraries == ("libstdc++.so.6",)
    assert host.glibcxx == (3, 4, 29)
    assert host.packages["libatomic.so.1"] == "libatomic1"
    assert host.packages["libstdc++.so.6"] == "libstdc++6"
    assert all(row.source for row in HOSTS)
    assert host_for("Linux", "riscv64") is None
    assert host_for("Darwin", "aarch64") is None


# -- the layout and the components ------------------------------------------------------------------


def test_the_layout_is_the_hosts(aarch64_sdk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidSdkError) as caught:
        sdk_from_root(aarch64_sdk, "--sdk")  # on x86_64: another host's libraries only
    assert "has host libraries for Linux aarch64 (lib/aarch64-oe-linux-gcc11.2/) only, none for this Linux x86_64" \
        in caught.value.message
    monkeypatch.setenv(FORCE_MACHINE_VARIABLE, "aarch64")
    sdk = sdk_from_root(aarch64_sdk, "--sdk")
    assert sdk.lib_dir == aarch64_sdk / AARCH64_LIB_DIR
    assert sdk.bin_dir == aarch64_sdk / AARCH64_BIN_DIR


def test_the_host_component_is_this_hosts_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    assert component_of("lib/x86_64-linux-clang/libQnnHtp.so") == "host"
    assert component_of(f"{AARCH64_LIB_DIR}/libQnnHtp.so") is None  # another host's: `all` only
    monkeypatch.setenv(FORCE_MACHINE_VARIABLE, "aarch64")
    assert component_of(f"{AARCH64_LIB_DIR}/libQnnHtp.so") == "host"
    assert component_of(f"{AARCH64_BIN_DIR}/qnn-net-run") == "host"
    assert component_of("lib/x86_64-linux-clang/libQnnHtp.so") is None
    assert component_of("include/QNN/QnnInterface.h") == "host"


def test_an_archive_without_this_hosts_libraries_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    names = [member_path(f"qairt/{VERSION}/{AARCH64_LIB_DIR}/libQnnHtp.so")]
    with pytest.raises(NoHostLibrariesError) as caught:
        sdk_top(names)
    assert caught.value.exit_code == 5
    assert "Linux aarch64" in caught.value.message
    assert "Linux x86_64" in caught.value.message
    monkeypatch.setenv(FORCE_MACHINE_VARIABLE, "aarch64")
    assert str(sdk_top(names)) == f"qairt/{VERSION}"


def test_install_by_parts_fetches_the_aarch64_host(server: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    archive = build_two_host_archive(tmp_path)
    server.add(f"/{VERSION}/v{VERSION}.zip", archive.read_bytes())
    env = aarch64_env(QNNCTL_MIRROR=server.base)
    result = run_qnnctl("install", VERSION, "--components", "host", env=env)
    assert result.returncode == 0, result.stderr
    root = Path(result.stdout.strip())
    assert sorted(p.name for p in (root / AARCH64_LIB_DIR).iterdir()) == ["libQnnHtp.so", "libQnnSystem.so"]
    assert (root / AARCH64_BIN_DIR / "qnn-net-run").is_file()
    assert not (root / HOST_LIB_DIR).exists()  # x86_64's libraries are not this host's
    assert not (root / "lib" / "aarch64-android").exists()
    ranged = [r for r in server.requests if r.headers.get("Range")]
    assert ranged, "fetched by parts, with Range requests"

    exported = run_qnnctl("env", VERSION, "--shell", "json", env=env)
    assert exported.returncode == 0, exported.stderr
    values = json.loads(exported.stdout)
    assert values["LD_LIBRARY_PATH"].split(":")[0] == str(root / AARCH64_LIB_DIR)
    assert values["PATH"].split(":")[0] == str(root / AARCH64_BIN_DIR)


def test_a_whole_install_on_each_host(tmp_path: Path, cache_dir: Path) -> None:
    only_aarch64 = build_two_host_archive(tmp_path, x86_64=False)
    refused = run_qnnctl("install", "--file", str(only_aarch64))
    assert refused.returncode == 5, refused.stderr
    assert "has host libraries for Linux aarch64" in refused.stderr
    assert "this Linux x86_64 host" in refused.stderr
    result = run_qnnctl("install", "--file", str(only_aarch64), env=aarch64_env())
    assert result.returncode == 0, result.stderr
    root = Path(result.stdout.strip())
    with zipfile.ZipFile(only_aarch64) as zf:
        assert f"qairt/{VERSION}/{AARCH64_LIB_DIR}/libQnnSystem.so" in zf.namelist()
    assert (root / AARCH64_LIB_DIR / "libQnnSystem.so").is_file()
    which = run_qnnctl("which", "qnn-net-run", env=aarch64_env())
    assert which.returncode == 0, which.stderr
    assert which.stdout.strip() == str(root / AARCH64_BIN_DIR / "qnn-net-run")
    lowered = run_qnnctl("lower", "--", "sh", "-c", 'echo "$LD_LIBRARY_PATH"', env=aarch64_env())
    assert lowered.returncode == 0, lowered.stderr
    assert lowered.stdout.split(":")[0].strip() == str(root / AARCH64_LIB_DIR)
    # A library as this host's loader finds it: the aarch64 one, past the x86_64 one of this machine.
    system = aarch64_system(tmp_path / "system")
    which = run_qnnctl("which", "libstdc++.so.6", env=aarch64_env(LD_LIBRARY_PATH=str(system)))
    assert which.returncode == 0, which.stderr
    assert which.stdout.strip() == str(system / "libstdc++.so.6")


# -- doctor ----------------------------------------------------------------------------------------


def doctor(root: Path, system: Path | None, machine: str = "aarch64") -> dict[str, dict[str, str]]:
    env = {**os.environ, FORCE_MACHINE_VARIABLE: machine}
    env.pop("LD_LIBRARY_PATH", None)
    if system is not None:
        env["LD_LIBRARY_PATH"] = str(system)  # the aarch64 system's libraries, as its loader finds them
    result = run_qnnctl("doctor", "--sdk", str(root), "--json", "--offline", env=env)
    assert result.returncode in (0, 1), result.stderr
    return {check["id"]: check for check in json.loads(result.stdout)["checks"]}


def test_doctor_on_an_aarch64_host(aarch64_sdk: Path, tmp_path: Path) -> None:
    checks = doctor(aarch64_sdk, aarch64_system(tmp_path / "system"))
    assert checks["host"]["status"] == "ok"
    assert "Linux aarch64" in checks["host"]["detail"]
    assert checks["sdk.layout"]["status"] == "ok", checks["sdk.layout"]
    assert checks["libraries"]["status"] == "ok", checks["libraries"]
    assert checks["libstdc++"]["status"] == "ok", checks["libstdc++"]
    assert "GLIBCXX_3.4.29 needed" in checks["libstdc++"]["detail"]
    assert checks["cpu"]["status"] == "ok"
    assert "no MKLDNN guard" in checks["cpu"]["detail"]


def test_doctor_names_libatomic1_when_libatomic_is_missing(aarch64_sdk: Path, tmp_path: Path) -> None:
    checks = doctor(aarch64_sdk, aarch64_system(tmp_path / "system", atomic=False))
    assert checks["libraries"]["status"] == "fail"
    assert "libatomic.so.1 not found (needed by libQnnSystem.so)" in checks["libraries"]["detail"]
    assert "sudo apt-get install libatomic1" in checks["libraries"]["hint"]


def test_doctor_names_libstdcxx6_when_libstdcxx_is_too_old(aarch64_sdk: Path, tmp_path: Path) -> None:
    checks = doctor(aarch64_sdk, aarch64_system(tmp_path / "system", glibcxx="3.4.28"))
    outcome = checks["libstdc++"]
    assert outcome["status"] == "fail"
    assert "needs GLIBCXX_3.4.29" in outcome["detail"]
    assert "up to GLIBCXX_3.4.28" in outcome["detail"]
    assert "libstdc++6" in outcome["hint"]


def test_doctor_names_libraries_of_another_machine(aarch64_sdk: Path, tmp_path: Path) -> None:
    """x86_64 libraries where the aarch64 ones belong: the ELF machine is this host's or wrong."""
    x86 = build_sdk_tree(tmp_path / "x86")
    for name in ("libQnnHtp.so", "libQnnSystem.so"):
        (aarch64_sdk / AARCH64_LIB_DIR / name).write_bytes((x86 / HOST_LIB_DIR / name).read_bytes())
    checks = doctor(aarch64_sdk, aarch64_system(tmp_path / "system"))
    assert checks["libraries"]["status"] == "fail"
    assert "libQnnHtp.so, libQnnSystem.so are built for x86_64, not this Linux aarch64 host" \
        in checks["libraries"]["detail"]


def test_runtime_staging_is_x86_64s(tmp_path: Path, cache_dir: Path) -> None:
    result = run_qnnctl("install", "--runtime", env=aarch64_env())
    assert result.returncode == 2, result.stderr
    assert "on Linux aarch64 the SDK's libraries use the system's GNU libstdc++" in result.stderr
    assert "libstdc++6 libatomic1" in result.stderr


def test_the_amd_guard_is_x86s() -> None:
    amd = {"QNNCTL_FORCE_CPU_VENDOR": "AuthenticAMD"}
    assert amd_guard_needed({**amd, FORCE_MACHINE_VARIABLE: "x86_64"})
    assert not amd_guard_needed({**amd, FORCE_MACHINE_VARIABLE: "aarch64"})


def test_component_digests_are_the_same_on_every_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock or a mirror's index written on x86_64 says the same as one written on aarch64: its
    digests partition the SDK as on x86_64, whatever the host (a whole install checks them all)."""
    root = add_aarch64_host(build_sdk_tree(tmp_path / "sdk"), tmp_path)
    on_x86_64 = tree_digests(root)
    monkeypatch.setenv(FORCE_MACHINE_VARIABLE, "aarch64")
    assert tree_digests(root) == on_x86_64
    assert component_of(f"{AARCH64_LIB_DIR}/libQnnHtp.so") == "host"  # while choosing members, this host's


def test_an_index_written_on_x86_64_serves_an_aarch64_host(server: FaultServer, tmp_path: Path,
                                                           cache_dir: Path) -> None:
    """A mirror indexed on x86_64 (its digests as there): an aarch64 host asking for `host` gets
    the whole SDK, checked whole against the index, instead of a tree no digest covers."""
    archive = build_two_host_archive(tmp_path)
    server.add(f"/{VERSION}/v{VERSION}.zip", archive.read_bytes())
    kept = tmp_path / "mirror"
    made = run_qnnctl("mirror", str(kept), VERSION, env={**os.environ, "QNNCTL_MIRROR": server.base,
                                                        "QNNCTL_CACHE_DIR": str(tmp_path / "indexer")})
    assert made.returncode == 0, made.stderr
    assert "components" in json.dumps(json.loads((kept / "index.json").read_text()))
    with FaultServer() as mirror:
        for path in kept.rglob("*"):
            if path.is_file():
                mirror.add("/" + path.relative_to(kept).as_posix(), path.read_bytes())
        result = run_qnnctl("install", VERSION, "--components", "host", env=aarch64_env(QNNCTL_MIRROR=mirror.base))
    assert result.returncode == 0, result.stderr
    assert "installing the whole SDK, checked whole" in result.stderr
    root = Path(result.stdout.strip())
    assert (root / AARCH64_LIB_DIR / "libQnnSystem.so").is_file()


def test_a_mirror_made_on_aarch64_records_the_build_its_libraries_carry(tmp_path: Path) -> None:
    """`qnnctl mirror DIR --file` names an archive by the build id of this host's libraries, as
    install does: on aarch64, those of the aarch64 folder (an archive of that host's alone)."""
    archive = build_two_host_archive(tmp_path, x86_64=False, build_id=f"v{VERSION}101010")
    proc = run_qnnctl("mirror", str(tmp_path / "mirror"), "--file", str(archive), env=aarch64_env())
    assert proc.returncode == 0, proc.stderr
    index = json.loads((tmp_path / "mirror" / "index.json").read_text())
    assert index["versions"][VERSION]["build_id"] == f"{VERSION}101010"
