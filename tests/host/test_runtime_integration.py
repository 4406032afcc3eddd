"""The host runtime wired into the commands: install, env, lower and doctor, run for real.

apt-get always fails here (a shim first on PATH that logs its calls), so the libc++ trio
comes from an LLVM-layout archive served on 127.0.0.1; a test that serves none gets a closed
port. The SDK libraries that need libc++ are linked against a stub libc++.so.1 that is not in
the SDK, and that same stub is what the archive holds, so a staged copy really loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from qnnctl.host.llvm import LLVM_SHA256_ENV, LLVM_URL_ENV
from qnnctl.host.runtime import RuntimeRequest, ensure_trio, stage_runtime
from qnnctl.host.staged import LOADER, LOADER_GUARD, TRIO
from qnnctl.run.lower import StagedLoader, under_loader
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.layout import HOST_LIB_DIR, Sdk
from qnnctl.shell.exports import apply
from tests.conftest import run_qnnctl
from tests.host.test_runtime import LLVM_TOP, llvm_archive, needs_host_without_trio, nothing_staged, stub_trio
from tests.host.test_runtime_trust import marked_trio
from tests.httpserver import FaultServer
from tests.lowerkit import write
from tests.sdkfactory import VERSION, SdkSpec, build_archive, build_sdk_tree, compile_shared, install_tree_into_cache

PY = sys.executable
LLVM_PATH = f"/llvmorg-14.0.0/{LLVM_TOP}.tar.xz"
CLOSED_PORT_URL = "http://127.0.0.1:9/no-llvm-archive-here.tar.xz"
# libQnnHtp.so calls into the stub libc++.so.1 (stub_trio's libcxx_stub returns 7).
HTP_SOURCE = "int libcxx_stub(void);\nint qnn_htp_answer(void) { return libcxx_stub() + 35; }\n"


@pytest.fixture(autouse=True)
def apt_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """apt-get fails and logs its arguments; the LLVM archive is unreachable unless served."""
    shims = tmp_path / "shims"
    shims.mkdir()
    log = tmp_path / "apt-get.log"
    shim = shims / "apt-get"
    shim.write_text(f"#!/bin/sh\necho \"$*\" >> {shlex.quote(str(log))}\n"
                    "echo 'E: Unable to locate package libc++1-14' >&2\nexit 100\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(LLVM_URL_ENV, CLOSED_PORT_URL)
    monkeypatch.setenv(LLVM_SHA256_ENV, "0" * 64)  # vouched for, so that it is tried, and fails
    monkeypatch.delenv(LOADER_GUARD, raising=False)
    return log


@dataclass(frozen=True)
class Llvm:
    """The LLVM release archive on the loopback server, with the stubs it holds."""

    server: FaultServer
    url: str
    libs: dict[str, bytes]
    stubs: Path  # the stub trio on disk, the same bytes as in the archive

    def requests(self) -> int:
        return len(self.server.requests_for(LLVM_PATH))


@pytest.fixture
def llvm(server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Llvm:
    data, libs = llvm_archive(tmp_path / "llvm", big=64 << 10)
    url = server.add(LLVM_PATH, data, "application/x-xz")
    monkeypatch.setenv(LLVM_URL_ENV, url)
    monkeypatch.setenv(LLVM_SHA256_ENV, hashlib.sha256(data).hexdigest())
    return Llvm(server, url, libs, tmp_path / "llvm" / "stubs")


def htp_needing_libcxx(stubs: Path, dest: Path) -> bytes:
    """A libQnnHtp.so with DT_NEEDED libc++.so.1 (the stub in `stubs`, which stays out of the SDK)."""
    built = compile_shared(dest, HTP_SOURCE, extra=[str(stubs / "libc++.so.1")])
    return built.read_bytes()


def glibc_beside_loader(libc: Path, folder: Path) -> Path:
    """`folder`, made, holding `libc` as libc.so.6 beside this host's loader: a glibc to stage
    (the stub libc of htp_needing_glibc_2_99 makes it a glibc 2.99)."""
    folder.mkdir()
    shutil.copy(host_loader_dir() / LOADER, folder / LOADER)
    shutil.copy(libc, folder / "libc.so.6")
    return folder


def htp_needing_glibc_2_99(lib_dir: Path, work: Path) -> Path:
    """Replace the SDK's libQnnHtp.so by one referencing GLIBC_2.99; the stub libc that defines it.

    As tests/host/test_runtime.py's new_glibc_sdk does it.
    """
    stub = work / "stub-libc"
    stub.mkdir(parents=True)
    version_script = stub / "v.map"
    version_script.write_text("GLIBC_2.99 { global: qnn_new_symbol; local: *; };\n")
    libc = compile_shared(stub / "libc.so.6", "int qnn_new_symbol(void) { return 1; }\n",
                          extra=["-Wl,-soname,libc.so.6", f"-Wl,--version-script={version_script}"])
    source = work / "htp.c"
    source.write_text("int qnn_new_symbol(void);\nint qnn_htp(void) { return qnn_new_symbol(); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-nostdlib", "-o", str(lib_dir / "libQnnHtp.so"),
                    str(source), str(libc)], check=True)
    return libc


def host_loader_dir() -> Path:
    loader = Path("/lib64") / LOADER
    if not loader.exists():
        pytest.skip("no x86-64 glibc loader at the usual path")
    return Path(os.path.realpath(loader)).parent


def staged_dirs(cache_dir: Path) -> list[str]:
    runtime = cache_dir / "runtime"
    return sorted(p.name for p in runtime.iterdir()) if runtime.is_dir() else []


def sh_values(exports: str, *names: str) -> list[str | None]:
    """Evaluate sh exports in a real sh and read `names` back (None: unset)."""
    script = r"""
eval "$1"; shift
for n; do
  if eval "[ -n \"\${$n+x}\" ]"; then eval "printf '+%s\n' \"\$$n\""; else echo -; fi
done
"""
    env = {"PATH": os.environ["PATH"]}
    out = subprocess.run(["sh", "-c", script, "sh", exports, *names], capture_output=True, text=True,
                         env=env, check=True).stdout.splitlines()
    return [line[1:] if line.startswith("+") else None for line in out]


def split_plan(stdout: str) -> tuple[str, list[str]]:
    """`lower --dry-run` output: the exports, and the command (its last line) as argv."""
    lines = stdout.rstrip("\n").split("\n")
    return "\n".join(lines[:-1]) + "\n", shlex.split(lines[-1])


def installed_sdk_needing_libcxx(cache_dir: Path, stubs: Path) -> Path:
    root = install_tree_into_cache(cache_dir)
    htp_needing_libcxx(stubs, root / HOST_LIB_DIR / "libQnnHtp.so")
    return root


# -- install ---------------------------------------------------------------------------


def test_fresh_install_stages_the_trio_and_env_exports_it(llvm: Llvm, apt_log: Path, tmp_path: Path,
                                                          cache_dir: Path) -> None:
    needs_host_without_trio()
    htp = htp_needing_libcxx(llvm.stubs, tmp_path / "build" / "libQnnHtp.so")
    archive = build_archive(tmp_path, "tar.gz", SdkSpec(extra_files={f"{HOST_LIB_DIR}/libQnnHtp.so": htp}))
    proc = run_qnnctl("install", "--file", str(archive))
    assert proc.returncode == 0, proc.stderr
    root = cache_dir / "sdks" / VERSION
    assert proc.stdout == f"{root}\n"
    assert "need libc++.so.1, which this host lacks; staging them" in proc.stderr
    assert "staged libc++ runtime" in proc.stderr
    assert not (root / HOST_LIB_DIR / "libc++.so.1").exists()  # the SDK does not ship it
    assert staged_dirs(cache_dir) == ["libcxx-14.0.0"]
    trio = cache_dir / "runtime" / "libcxx-14.0.0" / "lib"
    assert {n: (trio / n).read_bytes() for n in TRIO} == llvm.libs
    assert "download libc++1-14" in apt_log.read_text()  # apt-get first, then the archive
    assert llvm.requests() == 1

    # env puts the staged trio right after the SDK's own folder, and --unset takes it off.
    lib = str(root / HOST_LIB_DIR)
    base = {**os.environ, "LD_LIBRARY_PATH": "/opt/caller/lib"}
    exported = run_qnnctl("env", VERSION, "--shell", "json", env=base)
    assert exported.returncode == 0, exported.stderr
    values = json.loads(exported.stdout)
    assert values["LD_LIBRARY_PATH"].split(":") == [lib, str(trio), "/opt/caller/lib"]
    after = apply(base, values)
    undone = run_qnnctl("env", "--unset", "--shell", "json", env=after)
    assert undone.returncode == 0, undone.stderr
    assert apply(after, json.loads(undone.stdout))["LD_LIBRARY_PATH"] == "/opt/caller/lib"
    # doctor names the staged runtime, and the libraries resolve through it.
    report = json.loads(run_qnnctl("doctor", "--json", "--offline").stdout)
    checks = {c["id"]: c for c in report["checks"]}
    assert "staged host runtime: libcxx-14.0.0" in checks["cache"]["detail"]
    assert checks["libraries"]["status"] == "ok", checks["libraries"]
    # A second install of the same archive finds everything in place: no second fetch.
    again = run_qnnctl("install", "--file", str(archive))
    assert again.returncode == 0, again.stderr
    assert llvm.requests() == 1


def test_what_is_staged_unasked_is_held_to_the_projects_lock(llvm: Llvm, tmp_path: Path, cache_dir: Path) -> None:
    """In a project whose lock pins the staged runtime, the trio `install` and `lower` stage on
    their own (no --runtime) is held to it as `install --runtime`'s is: another LLVM archive,
    sound and vouched for by its own sha256, is refused and nothing is staged from it."""
    needs_host_without_trio()
    root = installed_sdk_needing_libcxx(cache_dir, llvm.stubs)
    manifest = json.loads((root / ".qnnctl.json").read_text())
    manifest.update(sha256="e" * 64, size=1234)  # installed from an archive it recorded
    (root / ".qnnctl.json").write_text(json.dumps(manifest))
    project = tmp_path / "project"
    project.mkdir()
    first = run_qnnctl("install", VERSION, cwd=project)
    assert first.returncode == 0, first.stderr
    assert staged_dirs(cache_dir) == ["libcxx-14.0.0"]
    locked = run_qnnctl("lock", VERSION, cwd=project)
    assert locked.returncode == 0, locked.stderr
    assert "[runtime.\"libcxx\"]" in (project / "qnnctl.lock").read_text()
    shutil.rmtree(cache_dir / "runtime")

    other, _ = llvm_archive(tmp_path / "other", big=1 << 10, libs=marked_trio(tmp_path / "other", 666))
    llvm.server.add(LLVM_PATH, other, "application/x-xz")
    env = {**os.environ, LLVM_SHA256_ENV: hashlib.sha256(other).hexdigest()}
    refused = run_qnnctl("install", VERSION, cwd=project, env=env)
    assert refused.returncode == 4, refused.stderr
    assert refused.stdout == ""
    assert f"is not the libcxx runtime {project / 'qnnctl.lock'} pins" in refused.stderr
    nothing_staged(cache_dir)
    lowered = run_qnnctl("lower", "--sdk", VERSION, "--", "true", cwd=project, env=env)
    assert f"is not the libcxx runtime {project / 'qnnctl.lock'} pins" in lowered.stderr
    nothing_staged(cache_dir)
    requests = llvm.requests()

    same, _ = llvm_archive(tmp_path / "same", big=1 << 10, libs=llvm.libs)
    llvm.server.add(LLVM_PATH, same, "application/x-xz")
    env[LLVM_SHA256_ENV] = hashlib.sha256(same).hexdigest()
    accepted = run_qnnctl("install", VERSION, cwd=project, env=env)
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout == f"{root}\n"
    trio = cache_dir / "runtime" / "libcxx-14.0.0" / "lib"
    assert {n: (trio / n).read_bytes() for n in TRIO} == llvm.libs
    assert llvm.requests() == requests + 1


def test_install_reusing_executorchs_copy_stages_the_trio_it_needs(llvm: Llvm, tmp_path: Path,
                                                                   cache_dir: Path) -> None:
    needs_host_without_trio()
    staging = tmp_path / "et-staging"
    root = build_sdk_tree(staging / f"sdk-{VERSION}", SdkSpec())
    htp_needing_libcxx(llvm.stubs, root / HOST_LIB_DIR / "libQnnHtp.so")
    env = {**os.environ, "QNN_STAGING_DIR": str(staging)}
    proc = run_qnnctl("install", VERSION, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{root}\n"  # ExecuTorch's copy, reused as it is
    assert staged_dirs(cache_dir) == ["libcxx-14.0.0"]
    assert llvm.requests() == 1
    report = json.loads(run_qnnctl("doctor", "--sdk", VERSION, "--json", "--offline", env=env).stdout)
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["libraries"]["status"] == "ok", checks["libraries"]
    assert checks["load"]["status"] == "ok", checks["load"]


def test_install_fails_when_staging_fails_keeps_the_sdk_and_says_how_to_retry(server: FaultServer, tmp_path: Path,
                                                                               cache_dir: Path) -> None:
    needs_host_without_trio()
    stubs = tmp_path / "stubs"
    stub_trio(stubs)
    htp = htp_needing_libcxx(stubs, tmp_path / "build" / "libQnnHtp.so")
    archive = build_archive(tmp_path, "zip", SdkSpec(extra_files={f"{HOST_LIB_DIR}/libQnnHtp.so": htp}))
    missing = server.url("/no-such-llvm.tar.xz")
    proc = run_qnnctl("install", "--file", str(archive), env={**os.environ, LLVM_URL_ENV: missing})
    # An SDK that cannot load here is no success: the exit code of the failed download.
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == ""
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("qnnctl: error:")]
    assert f"SDK {VERSION} is installed at {cache_dir / 'sdks' / VERSION}, but cannot load on this host" in error
    assert "HTTP 404" in error
    assert f"`qnnctl install {VERSION} --runtime`" in proc.stderr  # for this SDK, whatever the project pins
    assert len(server.requests_for("/no-such-llvm.tar.xz")) == 1  # a 404 is not retried
    nothing_staged(cache_dir)
    assert (cache_dir / "sdks" / VERSION / ".qnnctl.json").is_file()
    # Run again (the SDK now reused from the cache), it still says so rather than exit 0.
    again = run_qnnctl("install", VERSION, env={**os.environ, LLVM_URL_ENV: missing})
    assert again.returncode == 3, again.stderr
    assert "cannot load on this host" in again.stderr


def test_install_of_an_sdk_that_needs_no_libcxx_stages_nothing(llvm: Llvm, apt_log: Path, tmp_path: Path,
                                                               cache_dir: Path) -> None:
    needs_host_without_trio()
    archive = build_archive(tmp_path, "zip")
    proc = run_qnnctl("install", "--file", str(archive))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{cache_dir / 'sdks' / VERSION}\n"
    assert "staging" not in proc.stderr
    assert not (cache_dir / "runtime").exists()
    assert llvm.server.requests == []
    assert not apt_log.exists()


def test_ensure_trio_does_nothing_where_the_sdk_finds_its_trio(llvm: Llvm, tmp_path: Path, cache: Cache,
                                                               cache_dir: Path) -> None:
    """What `install` and `lower` call, in this process: it stages the trio once, and returns None,
    having done nothing, while the cache or the SDK has what the SDK's libraries need."""
    needs_host_without_trio()
    sdk = Sdk(installed_sdk_needing_libcxx(cache_dir, llvm.stubs), VERSION, "qnnctl cache")
    staged = ensure_trio(cache, sdk, os.environ, tmp_path)
    assert staged is not None
    assert staged.libcxx_action == "staged"
    assert (staged_dirs(cache_dir), llvm.requests()) == (["libcxx-14.0.0"], 1)
    assert ensure_trio(cache, sdk, os.environ, tmp_path) is None
    shutil.rmtree(cache_dir / "runtime")
    for soname in TRIO:
        shutil.copy(llvm.stubs / soname, sdk.lib_dir / soname)
    assert ensure_trio(cache, sdk, os.environ, tmp_path) is None
    assert (staged_dirs(cache_dir), llvm.requests()) == ([], 1)


def test_ensure_trio_reads_the_sdk_for_its_glibc_too(llvm: Llvm, tmp_path: Path, cache: Cache, cache_dir: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The trio is staged for the SDK given: one that also needs a newer glibc than the host's is
    told that it does (no glibc package was given, so none is staged)."""
    needs_host_without_trio()
    sdk = Sdk(installed_sdk_needing_libcxx(cache_dir, llvm.stubs), VERSION, "qnnctl cache")
    stub = tmp_path / "stub-libc"
    stub.mkdir()
    (stub / "v.map").write_text("GLIBC_2.99 { global: qnn_new_symbol; local: *; };\n")
    libc = compile_shared(stub / "libc.so.6", "int qnn_new_symbol(void) { return 1; }\n",
                          extra=["-Wl,-soname,libc.so.6", f"-Wl,--version-script={stub / 'v.map'}"])
    compile_shared(sdk.lib_dir / "libQnnGlibcNeeder.so", "int qnn_new_symbol(void);\n"
                   "int qnn_needer(void) { return qnn_new_symbol(); }\n", extra=["-nostdlib", str(libc)])
    staged = ensure_trio(cache, sdk, os.environ, tmp_path)
    assert staged is not None
    assert (staged.libcxx_action, staged.glibc_action, staged.glibc) == ("staged", "missing", None)
    assert "the SDK needs glibc 2.99 and this host has" in caplog.text
    assert staged_dirs(cache_dir) == ["libcxx-14.0.0"]


# -- lower -----------------------------------------------------------------------------


def test_lower_dry_run_stages_nothing_and_says_what_it_would(llvm: Llvm, cache_dir: Path) -> None:
    needs_host_without_trio()
    root = installed_sdk_needing_libcxx(cache_dir, llvm.stubs)
    write(Path("pipeline.py"), "print('lowered')\n")
    # A dry run fetches nothing, not even the runtime; it says what a real run would stage.
    proc = run_qnnctl("lower", "--dry-run", "--keep-mkldnn", "--python", PY, "pipeline.py")
    assert proc.returncode == 0, proc.stderr
    note = ("the SDK's libraries need libc++.so.1, which this host lacks: without --dry-run, qnnctl "
            "would stage them first")
    assert proc.stdout.startswith(f"# {note}")
    assert note in proc.stderr
    assert llvm.requests() == 0
    assert not (cache_dir / "runtime").exists()
    exports, argv = split_plan(proc.stdout)
    assert sh_values(exports, "LD_LIBRARY_PATH") == [str(root / HOST_LIB_DIR)]
    assert argv == [PY, "pipeline.py"]
    offline = run_qnnctl("lower", "--no-install", "--dry-run", "--keep-mkldnn", "--python", PY, "pipeline.py")
    assert offline.returncode == 0, offline.stderr
    assert "would stage" not in offline.stdout + offline.stderr  # --no-install would not either
    # Once staged (by a real run), the plan uses it as it is.
    staged = run_qnnctl("install", "--runtime")
    assert staged.returncode == 0, staged.stderr
    trio = cache_dir / "runtime" / "libcxx-14.0.0" / "lib"
    again = run_qnnctl("lower", "--dry-run", "--keep-mkldnn", "--python", PY, "pipeline.py")
    assert again.returncode == 0, again.stderr
    assert "stag" not in again.stderr
    exports, _ = split_plan(again.stdout)
    (path,) = sh_values(exports, "LD_LIBRARY_PATH")
    assert path == f"{root / HOST_LIB_DIR}:{trio}"
    assert llvm.requests() == 1


DLOPEN = """\
import ctypes, json
start = dict(e.split("=", 1) for e in open("/proc/self/environ").read().split("\\0") if "=" in e)
lib = ctypes.CDLL("libQnnHtp.so")
maps = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libc++" in line})
print(json.dumps({"answer": lib.qnn_htp_answer(), "ld": start.get("LD_LIBRARY_PATH"), "maps": maps}))
"""


def test_lower_runs_a_pipeline_that_loads_the_sdk_through_the_staged_trio(llvm: Llvm, cache_dir: Path) -> None:
    needs_host_without_trio()
    root = installed_sdk_needing_libcxx(cache_dir, llvm.stubs)
    script = write(Path("dlopen.py"), DLOPEN)
    lib = str(root / HOST_LIB_DIR)
    # The SDK's folder alone is not enough: its libc++.so.1 is nowhere on this host.
    alone = subprocess.run([PY, str(script)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "LD_LIBRARY_PATH": lib})
    assert alone.returncode != 0
    assert "libc++.so.1" in alone.stderr

    proc = run_qnnctl("lower", "--keep-mkldnn", "--python", PY, "dlopen.py")
    assert proc.returncode == 0, proc.stderr
    trio = cache_dir / "runtime" / "libcxx-14.0.0" / "lib"
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["answer"] == 42
    assert seen["ld"].split(":") == [lib, str(trio)]
    assert seen["maps"] == [str(trio / "libc++.so.1")]


# -- doctor ----------------------------------------------------------------------------


def doctor(*args: str) -> dict[str, dict[str, str | None]]:
    proc = run_qnnctl("doctor", "--json", "--offline", *args)
    assert proc.returncode in (0, 1), proc.stderr
    return {c["id"]: c for c in json.loads(proc.stdout)["checks"]}


def test_doctor_glibc_points_at_staging_and_knows_a_staged_glibc(tmp_path: Path, cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir)
    libc = htp_needing_glibc_2_99(root / HOST_LIB_DIR, tmp_path)
    before = doctor("--sdk", VERSION)["glibc"]
    assert before["status"] == "fail"
    assert "libQnnHtp.so needs GLIBC_2.99" in str(before["detail"])
    assert "`qnnctl install --runtime --runtime-from GLIBC.deb|GLIBC.rpm`" in str(before["hint"])

    # A glibc 2.99 (the stub libc, beside this host's loader) staged the way install does it.
    glibc = glibc_beside_loader(libc, tmp_path / "glibc")
    stub_trio(tmp_path / "trio")
    sources = (tmp_path / "trio", glibc)
    result = stage_runtime(Cache(cache_dir), Sdk(root, VERSION, "qnnctl cache"),
                           RuntimeRequest(sources=sources, use_apt=False), os.environ)
    assert result.glibc_action == "staged"
    assert result.glibc is not None
    after = doctor("--sdk", VERSION)["glibc"]
    assert after["status"] == "warn"
    assert f"staged glibc 2.99 ({result.glibc.lib_dir / LOADER})" in str(after["detail"])


def test_doctor_libraries_hint_for_a_missing_libcxx_then_ok_once_staged(llvm: Llvm, cache_dir: Path) -> None:
    needs_host_without_trio()
    installed_sdk_needing_libcxx(cache_dir, llvm.stubs)
    before = doctor("--sdk", VERSION)
    assert before["libraries"]["status"] == "fail"
    assert "libc++.so.1 not found (needed by libQnnHtp.so)" in str(before["libraries"]["detail"])
    assert str(before["libraries"]["hint"]).startswith("run `qnnctl install --runtime`")
    assert before["load"]["status"] == "fail"

    staged = run_qnnctl("install", VERSION, "--runtime")
    assert staged.returncode == 0, staged.stderr
    assert llvm.requests() == 1
    after = doctor("--sdk", VERSION)
    assert after["libraries"]["status"] == "ok", after["libraries"]
    assert after["load"]["status"] == "ok", after["load"]


# -- lower under a staged loader ---------------------------------------------------------


def test_lower_plan_starts_under_the_staged_loader_once(tmp_path: Path, cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir)
    lib = str(root / HOST_LIB_DIR)
    libc = htp_needing_glibc_2_99(root / HOST_LIB_DIR, tmp_path)
    glibc = glibc_beside_loader(libc, tmp_path / "glibc")
    stub_trio(tmp_path / "trio")
    result = stage_runtime(Cache(cache_dir), Sdk(root, VERSION, "qnnctl cache"),
                           RuntimeRequest(sources=(tmp_path / "trio", glibc), force=True, use_apt=False),
                           os.environ)
    assert result.glibc is not None
    assert result.libcxx is not None
    loader = result.glibc.lib_dir / LOADER
    trio = str(result.libcxx.lib_dir)
    write(Path("pipeline.py"), "print('lowered')\n")

    base = {**os.environ, "LD_LIBRARY_PATH": "/opt/caller/lib"}
    proc = run_qnnctl("lower", "--dry-run", "--keep-mkldnn", "--python", PY, "pipeline.py", "--arg", env=base)
    assert proc.returncode == 0, proc.stderr
    exports, argv = split_plan(proc.stdout)
    path, guard = sh_values(exports, "LD_LIBRARY_PATH", LOADER_GUARD)
    assert path == f"{lib}:{trio}:/opt/caller/lib"
    assert guard
    assert argv[:2] == [str(loader), "--library-path"]
    search = argv[2].split(":")
    assert search[0] == str(result.glibc.lib_dir)
    assert all(entry in search for entry in path.split(":"))  # ld.so reads no LD_LIBRARY_PATH
    assert argv[3:] == [PY, "pipeline.py", "--arg"]

    # A pipeline already started under the loader plans its own child without wrapping it again.
    inner = run_qnnctl("lower", "--dry-run", "--keep-mkldnn", "--python", PY, "pipeline.py",
                       env={**base, LOADER_GUARD: guard})
    assert inner.returncode == 0, inner.stderr
    inner_exports, inner_argv = split_plan(inner.stdout)
    assert inner_argv == [PY, "pipeline.py"]
    assert LOADER_GUARD not in inner_exports


# -- lower under a staged loader: only a glibc new enough, and scripts through their #! --


def stage_host_glibc(cache_dir: Path, root: Path, tmp_path: Path) -> Path:
    """This host's own glibc (loader, libc, libm), staged with --force; its folder."""
    glibc = tmp_path / "host-glibc"
    glibc.mkdir()
    for name in (LOADER, "libc.so.6", "libm.so.6"):
        shutil.copy(host_loader_dir() / name, glibc / name)
    stub_trio(tmp_path / "trio")
    result = stage_runtime(Cache(cache_dir), Sdk(root, VERSION, "qnnctl cache"),
                           RuntimeRequest(sources=(tmp_path / "trio", glibc), force=True, use_apt=False),
                           os.environ)
    assert result.glibc is not None
    return result.glibc.lib_dir


def test_a_staged_glibc_too_old_for_the_sdk_is_not_used(tmp_path: Path, cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir)
    stage_host_glibc(cache_dir, root, tmp_path)  # as old as this host's own
    htp_needing_glibc_2_99(root / HOST_LIB_DIR, tmp_path)  # then the SDK needs more
    write(Path("pipeline.py"), "print('lowered')\n")
    proc = run_qnnctl("lower", "--dry-run", "--keep-mkldnn", "--python", PY, "pipeline.py")
    assert proc.returncode == 0, proc.stderr
    assert split_plan(proc.stdout)[1][0] == PY
    assert "2.99" in proc.stderr
    assert "--runtime-from" in proc.stderr


SCRIPT_PROBE = """{shebang}
printf '%s|' "$@"; echo
grep -cF "$STAGED" /proc/$$/maps
"""


@pytest.mark.parametrize("shebang", ["#!/bin/sh", "#!/usr/bin/env sh"])
def test_a_script_command_runs_under_the_staged_loader(tmp_path: Path, cache_dir: Path, shebang: str) -> None:
    root = install_tree_into_cache(cache_dir)
    glibc = stage_host_glibc(cache_dir, root, tmp_path)
    tool = tmp_path / "tool"
    tool.write_text(SCRIPT_PROBE.format(shebang=shebang))
    tool.chmod(0o755)
    staged = StagedLoader(glibc / LOADER, (str(glibc),))
    environ = {"PATH": os.environ["PATH"], "STAGED": str(glibc)}
    argv, env = under_loader([str(tool), "a b", "c"], environ, staged)
    assert argv[0] == str(glibc / LOADER)
    ran = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    words, mapped = ran.stdout.splitlines()
    assert words == "a b|c|"
    assert int(mapped) >= 2  # the shell itself runs on the staged loader and libc


def test_which_resolves_as_the_staged_loader_would(tmp_path: Path, cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir)
    libc = htp_needing_glibc_2_99(root / HOST_LIB_DIR, tmp_path)
    glibc = glibc_beside_loader(libc, tmp_path / "glibc")
    result = stage_runtime(Cache(cache_dir), Sdk(root, VERSION, "qnnctl cache"),
                           RuntimeRequest(sources=(glibc,), force=True, use_apt=False), os.environ)
    assert result.glibc is not None
    found = run_qnnctl("which", "libc.so.6")
    assert found.returncode == 0, found.stderr
    assert found.stdout == f"{result.glibc.lib_dir / 'libc.so.6'}\n"  # not the host's
    report = json.loads(run_qnnctl("which", "--json", "libc.so.6").stdout)
    assert report["candidates"][0] == {"folder": str(result.glibc.lib_dir), "origin": "qnnctl's staged glibc",
                                       "holds": True}
    # Inside a pipeline already started under that loader, the environment is what it is.
    inner = run_qnnctl("which", "libQnnHtp.so", env={**os.environ, LOADER_GUARD: "1"})
    assert inner.stdout == f"{root / HOST_LIB_DIR / 'libQnnHtp.so'}\n"
