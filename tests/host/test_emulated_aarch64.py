"""qnnctl on a Linux aarch64 host, on Qualcomm's own aarch64 libraries: the host is an emulated
aarch64 Debian 12 (tests/emulated.py), the libraries those of onnxruntime-qnn 2.7.0's aarch64
wheel (QAIRT 2.51) in an SDK's archive (tests/genuine.py). qnnctl runs inside the guest, from this
checkout: install (whole and by parts from a loopback mirror), env in the guest's sh, doctor
(whose real load passes, and fails naming libatomic when the guest has none), and lower.

Everything here runs about ten times slower than on the host, so the tests share one guest and
one install per module. Select them with `-m emulated`. Without the root they skip, naming the
command that makes it; under CI they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from qnnctl.sdk.hosts import host_for
from tests import emulated, genuine
from tests.conftest import IN_CI, NOWHERE_PROXY
from tests.httpserver import FaultServer

pytestmark = pytest.mark.emulated

WHEEL = genuine.QAIRT_2_51_DEVICE
VERSION = WHEEL.qairt
AARCH64 = host_for("Linux", "aarch64")
assert AARCH64 is not None
LIB_DIR = AARCH64.lib_dir
# What QAIRT 2.51's aarch64 libraries answer (QnnInterface_getProviders, QnnSystemInterface_getProviders).
HTP_PROVIDER = "HTP_QTI_AISW (backend 6, core API 2.40.0, backend API 5.51.0)"
SYSTEM_PROVIDER = "(system API 1.15.0)"

# Nothing the guest runs in a test leaves the machine, as on the host (tests/conftest.py).
OFFLINE = {"HTTP_PROXY": NOWHERE_PROXY, "HTTPS_PROXY": NOWHERE_PROXY, "NO_PROXY": "127.0.0.1,localhost"}

# Run by `qnnctl lower -- python SCRIPT`: loads libQnnHtp.so as a lowering does (by name, so
# LD_LIBRARY_PATH decides) and lists what QnnInterface_getProviders offers.
LIST_PROVIDERS = r"""
import ctypes, os, sys

class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("patch", ctypes.c_uint32)]

class Interface(ctypes.Structure):  # QnnInterface_t's first fields (QnnInterface.h)
    _fields_ = [("backend_id", ctypes.c_uint32), ("name", ctypes.c_char_p), ("core", Version),
                ("backend", Version)]

htp = ctypes.CDLL("libQnnHtp.so")
get = htp.QnnInterface_getProviders
get.restype = ctypes.c_uint64
get.argtypes = [ctypes.POINTER(ctypes.POINTER(ctypes.POINTER(Interface))), ctypes.POINTER(ctypes.c_uint32)]
found = ctypes.POINTER(ctypes.POINTER(Interface))()
count = ctypes.c_uint32()
status = get(ctypes.byref(found), ctypes.byref(count))
if status != 0:
    sys.exit(f"QnnInterface_getProviders failed with {status}")
dotted = lambda v: "%d.%d.%d" % (v.major, v.minor, v.patch)
for i in range(count.value):
    p = found[i].contents
    print("provider", p.name.decode(), p.backend_id, dotted(p.core), dotted(p.backend))
print("QNN_SDK_ROOT", os.environ["QNN_SDK_ROOT"])
sys.exit(7)
"""


def unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason}; .ci/run makes it")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> emulated.Guest:
    """One guest for the module, its files in a folder of the module's."""
    reason = emulated.unavailable()
    if reason is not None:
        unavailable(reason)
    folder = tmp_path_factory.mktemp("aarch64")
    return emulated.Guest.create(emulated.root_path(), folder).with_env(
        QNNCTL_CACHE_DIR=str(folder / "cache"), **OFFLINE)


@pytest.fixture(scope="module")
def archive(guest: emulated.Guest) -> Path:
    """The aarch64 SDK's archive, where the guest sees it."""
    if genuine.wheel_path(WHEEL) is None:
        unavailable(genuine.missing_message(WHEEL.file_name))
    copy = guest.folder / f"v{VERSION}.zip"
    shutil.copyfile(genuine.cached_aarch64_archive(WHEEL), copy)
    return copy


@pytest.fixture(scope="module")
def installed(guest: emulated.Guest, archive: Path) -> Path:
    """The SDK installed in the guest with `qnnctl install --file`: its root."""
    done = guest.run(["qnnctl", "install", "--file", str(archive)])
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def checks(report: str) -> dict[str, dict[str, Any]]:
    """doctor --json's checks, by name."""
    return {check["id"]: check for check in json.loads(report)["checks"]}


def test_the_guest_is_an_aarch64_debian_apart_from_the_host(guest: emulated.Guest) -> None:
    host_only = shutil.which(emulated.QEMU)  # on the host, never in the guest
    assert host_only is not None
    done = guest.sh(f"""uname -m; cat /etc/debian_version; readlink /proc/self/ns/mnt
        grep -c '^CPU implementer' /proc/cpuinfo; grep -c '^vendor_id' /proc/cpuinfo
        stat -c %s {host_only} || echo no-stat; [ -x {host_only} ] && echo runs || echo no-exec
        grep -c shared: /proc/self/mountinfo""")
    lines = done.stdout.split()
    assert lines[0] == "aarch64", done.stderr
    assert lines[1].startswith("12.")
    # A mount namespace of its own, nothing in it propagated back to the host's.
    assert lines[2] != os.readlink("/proc/self/ns/mnt")
    assert lines[-1] == "0"
    assert lines[3:5] == ["2", "0"]  # the aarch64 cpuinfo, not the host's
    # The host's files stay out of sight to stat(1) (statx) and test -x (faccessat2) too.
    assert lines[5:7] == ["no-stat", "no-exec"], done.stderr


def test_install_file_takes_the_aarch64_sdk(guest: emulated.Guest, installed: Path) -> None:
    assert installed == guest.folder / "cache" / "sdks" / VERSION
    libraries = sorted(p.name for p in (installed / LIB_DIR).iterdir())
    assert libraries == sorted(name for name, place in genuine.aarch64_member_places(WHEEL).items()
                               if place.startswith(LIB_DIR))
    assert (installed / "lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so").is_file()
    assert not (installed / "lib/x86_64-linux-clang").exists()


def test_env_sets_up_the_guests_sh(guest: emulated.Guest, installed: Path) -> None:
    done = guest.sh('eval "$(qnnctl env)" && printf "%s\\n" "$QNN_SDK_ROOT" "$LD_LIBRARY_PATH" '
                    '&& qnnctl which libQnnHtp.so')
    assert done.returncode == 0, done.stderr
    root, library_path, htp = done.stdout.splitlines()
    assert root == str(installed)
    assert library_path.split(":")[0] == str(installed / LIB_DIR)
    assert htp == str(installed / LIB_DIR / "libQnnHtp.so")  # as the guest's loader finds it


def test_doctor_loads_the_libraries(guest: emulated.Guest, installed: Path) -> None:
    done = guest.sh('eval "$(qnnctl env)" && qnnctl doctor --offline --json')
    assert done.returncode == 0, done.stderr + done.stdout
    found = checks(done.stdout)
    assert found["host"]["status"] == "ok"
    assert "Linux aarch64" in found["host"]["detail"]
    load = found["load"]
    assert load["status"] == "ok", load
    assert f"libQnnHtp.so: {HTP_PROVIDER}" in load["detail"]
    assert SYSTEM_PROVIDER in load["detail"]
    assert found["libstdc++"]["status"] == "ok"
    assert "GLIBCXX_3.4.29 needed" in found["libstdc++"]["detail"]
    assert found["glibc"]["status"] == "ok"
    assert found["environment"]["status"] == "ok"
    # The stub needs the DSP's libcdsprpc.so, which only a device has: a warning, not a failure.
    assert found["libraries"]["status"] == "warn"
    assert "libcdsprpc.so not found (needed by libQnnHtpV73Stub.so)" in found["libraries"]["detail"]


def test_doctor_names_libatomic_when_the_host_lacks_it(guest: emulated.Guest, installed: Path) -> None:
    bare = guest.hiding("libatomic.so")
    done = bare.run(["qnnctl", "doctor", "--offline", "--json"])
    assert done.returncode == 1, done.stderr + done.stdout
    found = checks(done.stdout)
    libraries, load = found["libraries"], found["load"]
    assert libraries["status"] == "fail"
    assert "libatomic.so.1 not found (needed by libQnnSystem.so)" in libraries["detail"]
    assert "`sudo apt-get install libatomic1`" in libraries["hint"]
    assert load["status"] == "fail"
    assert "libatomic.so.1" in load["detail"]
    assert "`sudo apt-get install libatomic1`" in load["hint"]
    # The same guest with libatomic in sight loads: what failed is its absence.
    assert checks(guest.run(["qnnctl", "doctor", "--offline", "--json"]).stdout)["load"]["status"] == "ok"


def test_lower_runs_a_script_on_the_libraries(guest: emulated.Guest, installed: Path) -> None:
    script = guest.folder / "providers.py"
    script.write_text(LIST_PROVIDERS)
    done = guest.run(["qnnctl", "lower", "--", "python", str(script)])
    assert done.returncode == 7, done.stderr  # the pipeline's own exit code
    assert "provider HTP_QTI_AISW 6 2.40.0 5.51.0" in done.stdout.splitlines()
    assert f"QNN_SDK_ROOT {installed}" in done.stdout.splitlines()


@pytest.fixture(scope="module")
def mirror(guest: emulated.Guest, archive: Path) -> Path:
    """The folder `qnnctl mirror DIR --file ARCHIVE` makes in the guest."""
    folder = guest.folder / "mirror"
    made = guest.run(["qnnctl", "mirror", str(folder), "--file", str(archive)])
    assert made.returncode == 0, made.stderr
    assert (folder / "index.json").is_file()
    return folder


def install_by_parts(guest: emulated.Guest, mirror: Path, name: str,
                     index: bool) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`qnnctl install VERSION --components host` in a fresh cache of the guest's, from `mirror`
    served on 127.0.0.1 (with its index.json or without): what it did, and the byte ranges it
    asked the archive for."""
    fresh = guest.with_env(QNNCTL_CACHE_DIR=str(guest.folder / name))
    with FaultServer() as server:
        for path in sorted(p for p in mirror.rglob("*") if p.is_file()):
            if index or path.name != "index.json":
                server.add("/" + path.relative_to(mirror).as_posix(), path.read_bytes())
        done = fresh.run(["qnnctl", "install", VERSION, "--components", "host"], env={"QNNCTL_MIRROR": server.base})
        ranges = [r.headers["Range"] for r in server.requests_for(f"/{VERSION}/v{VERSION}.zip")
                  if r.headers.get("Range")]
    return done, ranges


def test_install_by_parts_from_a_loopback_mirror(guest: emulated.Guest, mirror: Path) -> None:
    done, ranges = install_by_parts(guest, mirror, "by-parts", index=False)
    assert done.returncode == 0, done.stderr
    root = Path(done.stdout.strip())
    assert root == guest.folder / "by-parts" / "sdks" / VERSION
    assert sorted(p.name for p in (root / LIB_DIR).iterdir()) == sorted(
        name for name, place in genuine.aarch64_member_places(WHEEL).items() if place.startswith(LIB_DIR))
    assert not (root / "lib/hexagon-v73").exists()  # not this host's: left on the server
    assert ranges, "the host's members were not fetched by parts"
    # What came by parts loads as what came whole.
    loaded = guest.with_env(QNNCTL_CACHE_DIR=str(guest.folder / "by-parts")).run(
        ["qnnctl", "doctor", "--offline", "--json"])
    assert checks(loaded.stdout)["load"]["status"] == "ok", loaded.stdout


def test_by_parts_with_the_mirrors_digests_installs_the_whole_sdk(guest: emulated.Guest, mirror: Path) -> None:
    """The index's component digests divide the SDK as on x86_64, where the aarch64 libraries are
    no `host` member: on aarch64 they cannot check `host` alone, so the whole SDK is installed and
    checked whole, as the README says."""
    done, _ = install_by_parts(guest, mirror, "checked-whole", index=True)
    assert done.returncode == 0, done.stderr
    assert ("index.json says components' digests as on Linux x86_64, which do not cover this Linux aarch64 "
            "host's components: installing the whole SDK, checked whole") in done.stderr
    root = Path(done.stdout.strip())
    assert (root / LIB_DIR / "libQnnSystem.so").is_file()
    assert (root / "lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so").is_file()


def test_a_guest_command_runs_in_the_guest_only(guest: emulated.Guest) -> None:
    """The runner itself: single device nodes, never the host's /dev; no bind of /dev/pts."""
    argv = guest.argv(["true"])
    binds = [argv[i + 1].split(":", 1) for i, a in enumerate(argv) if a == "-b"]
    assert ["/dev", "/dev"] not in binds
    assert all(h == g and h in emulated.DEVICES for h, g in binds if h.startswith("/dev"))
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert subprocess.run(argv, env=guest.environment(), check=False).returncode == 0
