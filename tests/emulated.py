"""A Linux aarch64 host on this x86_64 one, for the tests that run qnnctl on Qualcomm's own
aarch64 libraries (tests/host/test_emulated_aarch64.py).

The host is a Debian 12 (bookworm) arm64 root with Python, its venv module, libatomic1 and a
virtual environment holding qnnctl's dependencies from PyPI (never qnnctl itself: the guest runs
the checkout under test, bound into it and put on PYTHONPATH). It is made once, by `build`, and
kept between runs beside the wheels (tests/genuine.py's cache), in a folder named by what it
holds (`aarch64-root-r<revision>-<digest>/`), so that a change of qnnctl's dependencies makes a
new one. It is built in a folder of its own beside that place and renamed there when complete:
a build that is killed leaves nothing that is taken for a root. Removing it is always safe.

It runs without binfmt_misc: `debootstrap --foreign`, then its second stage and everything after
under `proot -q qemu-aarch64-static` (Debian's packages), about ten times slower than the host
(a python3 start takes about 0.3 s). Three traps, each met here:
- Debian's proot 5.1.0 does not translate the paths of the statx and faccessat2 system calls,
  which qemu passes through, so `stat`, `[ -x ]` and apt's key check would read the host's
  files. tests/enosys.c, compiled by the tests, makes those two calls fail with ENOSYS for proot
  and everything under it, qemu included, and glibc falls back to calls proot translates.
- The guest would see the host's /proc/cpuinfo (an x86 CPU), which crashes some aarch64 code
  under qemu; an aarch64 one is bound over it.
- The guest runs as root, and its mount, umount and mknod are real: with the host's /dev bound,
  debootstrap's second stage unmounts the host's /dev/pts. Every guest runs in a mount namespace
  of its own (`unshare --mount --propagation private`), and only single device nodes are bound,
  never the host's /dev.

The guest never writes into the root: its /tmp and HOME are folders of the caller's, bound in at
the paths they have on the host (so that a path the kernel reports, as in /proc/self/maps, is the
path the guest knows).

    python -m tests.emulated build          # make the root (as root; Debian's mirror and PyPI)
    python -m tests.emulated where          # where it is, or will be
    python -m tests.emulated run [CMD...]   # CMD (default: sh) in it, with this checkout's qnnctl
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from tests.genuine import CACHE, QAIRT_2_51_DEVICE, cached_aarch64_archive, wheel_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tests' own Python is 3.11 or newer
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
# Bump when the recipe below changes, so that a root made by the old one is not used.
ROOT_REVISION = 1
SUITE = "bookworm"
MIRROR_VARIABLE = "QNNCTL_TEST_DEBIAN_MIRROR"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "libatomic1")
VENV = "/opt/qnnctl"
QEMU = "qemu-aarch64-static"
BUILD_COMMAND = "python -m tests.emulated build"
# The programs the host needs, and the Debian package of each.
HOST_TOOLS = {"debootstrap": "debootstrap", "proot": "proot", QEMU: "qemu-user-static", "unshare": "util-linux",
              "cc": "gcc"}
# Device nodes bound into the guest one by one: never the host's whole /dev (see above).
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/shm")
GUEST_PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MULTIARCH = "/usr/lib/aarch64-linux-gnu"
ENOSYS_SOURCE = Path(__file__).with_name("enosys.c")
# A Cortex-A76 as Linux describes it, in place of the host's x86 /proc/cpuinfo.
CPUINFO = "".join(
    f"processor\t: {n}\nBogoMIPS\t: 50.00\n"
    "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x4\nCPU part\t: 0xd0b\nCPU revision\t: 1\n\n"
    for n in range(2)
)


def requirements() -> list[str]:
    """qnnctl's runtime dependencies, as pyproject.toml names them."""
    with open(REPO / "pyproject.toml", "rb") as f:
        project: dict[str, list[str]] = tomllib.load(f)["project"]
    return list(project["dependencies"])


def root_path(cache: Path = CACHE) -> Path:
    """Where the root for this recipe and these dependencies is kept."""
    recipe = json.dumps([ROOT_REVISION, SUITE, PACKAGES, VENV, requirements()])
    return cache / f"aarch64-root-r{ROOT_REVISION}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def missing_tools() -> list[str]:
    return sorted(name for name in HOST_TOOLS if shutil.which(name) is None)


def host_problem() -> str | None:
    """Why this machine cannot make or run the emulated host, with what to do; None when it can."""
    if platform.machine() != "x86_64":
        return f"the emulated aarch64 host is made for an x86_64 machine (tests/enosys.c), not {platform.machine()}"
    if os.geteuid() != 0:
        return "the emulated aarch64 host runs as root (a mount namespace of its own, the root's own files)"
    missing = missing_tools()
    if missing:
        packages = " ".join(sorted({HOST_TOOLS[name] for name in missing}))
        return f"{', '.join(missing)} not installed: `apt-get install {packages}`"
    return None


def unavailable() -> str | None:
    """Why no guest can run here, with what to do; None when one can."""
    problem = host_problem()
    if problem is None and not root_path().is_dir():
        problem = f"no emulated aarch64 root in {root_path()}: make it with `{BUILD_COMMAND}`"
    return problem


def compile_enosys(folder: Path) -> Path:
    """tests/enosys.c compiled into `folder`."""
    program = folder / "enosys"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", "-o", str(program), str(ENOSYS_SOURCE)], check=True)
    return program


@dataclass(frozen=True)
class Guest:
    """Commands run in the aarch64 root, with `folder` (its HOME, /tmp and a `qnnctl` command on
    PATH) and `checkout` bound in at their own paths and the checkout on PYTHONPATH."""

    root: Path
    folder: Path
    enosys: Path
    cpuinfo: Path
    checkout: Path | None = REPO
    binds: tuple[tuple[str, str], ...] = ()  # (host path, guest path)
    env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def create(cls, root: Path, folder: Path, checkout: Path | None = REPO) -> Guest:
        """A guest of `root` whose own files live in `folder` (made here)."""
        tools = folder / "tools"
        for sub in ("home", "tmp", "bin", "tools"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        cpuinfo = tools / "cpuinfo"
        cpuinfo.write_text(CPUINFO)
        # `qnnctl` as a user types it, from the checkout under test.
        command = folder / "bin" / "qnnctl"
        command.write_text('#!/bin/sh\nexec python -m qnnctl "$@"\n')
        command.chmod(0o755)
        return cls(root=root, folder=folder, enosys=compile_enosys(tools), cpuinfo=cpuinfo, checkout=checkout)

    @property
    def home(self) -> Path:
        return self.folder / "home"

    def with_binds(self, *binds: tuple[str, str]) -> Guest:
        return dataclasses.replace(self, binds=(*self.binds, *binds))

    def with_env(self, **env: str) -> Guest:
        return dataclasses.replace(self, env=(*self.env, *env.items()))

    def hiding(self, prefix: str) -> Guest:
        """This guest with the root's system libraries whose names start with `prefix` gone from
        its view (/usr/lib/aarch64-linux-gnu, hence /lib's too), the root itself untouched: a
        folder of links to the rest is bound over that folder."""
        real = "/.multiarch"
        view = self.folder / f"multiarch-without-{prefix}"
        if not view.is_dir():
            staging = Path(tempfile.mkdtemp(dir=self.folder))
            for entry in (self.root / MULTIARCH.lstrip("/")).iterdir():
                if not entry.name.startswith(prefix):
                    (staging / entry.name).symlink_to(f"{real}/{entry.name}")
            os.replace(staging, view)
        return self.with_binds((str(self.root / MULTIARCH.lstrip("/")), real), (str(view), MULTIARCH))

    def argv(self, command: Sequence[str], cwd: str | None = None) -> list[str]:
        binds: list[tuple[str, str]] = [(d, d) for d in DEVICES if os.path.exists(d)]
        binds += [("/proc", "/proc"), (str(self.cpuinfo), "/proc/cpuinfo"), (str(self.folder / "tmp"), "/tmp"),
                  (str(self.folder), str(self.folder))]
        if self.checkout is not None:
            binds.append((str(self.checkout), str(self.checkout)))
        binds += self.binds
        qemu = shutil.which(QEMU) or QEMU
        options = [arg for host, guest in binds for arg in ("-b", f"{host}:{guest}")]
        return ["unshare", "--mount", "--propagation", "private", str(self.enosys), "proot", "-r", str(self.root),
                "-q", qemu, *options, "-w", cwd or str(self.home), *command]

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {"PATH": f"{self.folder / 'bin'}:{GUEST_PATH}", "HOME": str(self.home), "TMPDIR": "/tmp",
               "LANG": "C.UTF-8", "TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1"}
        if self.checkout is not None:
            env["PYTHONPATH"] = str(self.checkout)
        env.update(self.env)
        env.update(extra or {})
        return env

    def run(self, command: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`command` in the guest (its environment is only what `environment` gives)."""
        return subprocess.run(self.argv(command, cwd), env=self.environment(env), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def sh(self, script: str, env: Mapping[str, str] | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`script` run by the guest's /bin/sh (dash)."""
        return self.run(["/bin/sh", "-c", script], env=env, timeout=timeout)


# -- building the root ---------------------------------------------------------------------------


def say(message: str) -> None:
    print(f"emulated: {message}", file=sys.stderr, flush=True)


def step(guest: Guest, what: str, command: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    """One step of the build, its output on stderr; a failure stops the build."""
    started = time.monotonic()
    say(f"{what}...")
    done = subprocess.run(guest.argv(command), env=guest.environment(env), stdin=subprocess.DEVNULL,
                          stdout=sys.stderr, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {' '.join(command)}")
    say(f"{what}: {time.monotonic() - started:.0f} s")


def network_env(guest: Guest) -> tuple[Guest, dict[str, str]]:
    """The guest as the build needs it to reach Debian's mirror and PyPI: the host's resolver,
    its proxies, and the certificates the host's pip trusts (a proxy that inspects TLS has its own)."""
    env = {name: value for name, value in os.environ.items()
           if name.lower() in ("http_proxy", "https_proxy", "no_proxy") or name == "PIP_INDEX_URL"}
    if os.path.isfile("/etc/resolv.conf"):
        guest = guest.with_binds(("/etc/resolv.conf", "/etc/resolv.conf"))
    trusted = next((os.environ[name] for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")
                    if os.path.isfile(os.environ.get(name, ""))), None)
    if trusted is not None:
        guest = guest.with_binds((trusted, "/etc/ssl/host-trusted.pem"))
        env["PIP_CERT"] = "/etc/ssl/host-trusted.pem"
    return guest, env


def build(cache: Path = CACHE, make: Callable[[Path], None] | None = None) -> Path:
    """The root in `cache`, made when it is not there yet (see the module's docstring) by `make`
    (`make_root`), which builds it as `root` in the folder it is given; its path."""
    final = root_path(cache)
    if final.is_dir():
        return final
    problem = host_problem()
    if problem is not None:
        raise RuntimeError(problem)
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / "aarch64-root.lock")):
        if final.is_dir():  # another build finished while this one waited
            return final
        for stale in cache.glob(".aarch64-root-*.build-*"):  # left by a build that was killed
            shutil.rmtree(stale)
        work = cache / f".{final.name}.build-{os.getpid()}"
        work.mkdir()
        try:
            (make or make_root)(work)
            os.rename(work / "root", final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def make_root(work: Path) -> None:
    started = time.monotonic()
    target = work / "root"
    mirror = os.environ.get(MIRROR_VARIABLE) or DEBIAN_MIRROR
    say(f"debootstrap's first stage ({SUITE}, arm64, from {mirror})...")
    subprocess.run(["debootstrap", "--arch=arm64", "--foreign", "--variant=minbase", SUITE, str(target), mirror],
                   stdout=sys.stderr, check=True)
    # In a container debootstrap links the root's /proc to /proc, a loop under proot.
    if (target / "proc").is_symlink():
        (target / "proc").unlink()
        (target / "proc").mkdir()
    guest, env = network_env(Guest.create(target, work / "session", checkout=None))
    env["DEBIAN_FRONTEND"] = "noninteractive"
    step(guest, "debootstrap's second stage", ["/debootstrap/debootstrap", "--second-stage"], env)
    step(guest, f"apt-get install {' '.join(PACKAGES)}", [
        "/bin/sh", "-c", "apt-get update -q && apt-get install -y -q --no-install-recommends "
        f"{' '.join(PACKAGES)} && apt-get clean && rm -rf /var/lib/apt/lists/*"], env)
    step(guest, f"a virtual environment in {VENV} with qnnctl's dependencies", [
        "/bin/sh", "-c", f'python3 -m venv {VENV} && {VENV}/bin/python -m pip install -q --no-cache-dir "$@"',
        "sh", *requirements()], env)
    say(f"made in {time.monotonic() - started:.0f} s")


def main(argv: list[str]) -> int:
    if argv == ["build"]:
        try:
            print(build())
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            say(str(exc))
            return 1
        return 0
    if argv == ["where"]:
        print(root_path())
        return 0
    if argv[:1] == ["run"]:
        problem = unavailable()
        if problem is not None:
            say(problem)
            return 1
        with tempfile.TemporaryDirectory(prefix="qnnctl-aarch64-") as folder:
            guest = Guest.create(root_path(), Path(folder))
            # The aarch64 SDK's archive (tests/genuine.py), where the host has it.
            if wheel_path(QAIRT_2_51_DEVICE) is not None:
                archive = cached_aarch64_archive()
                guest = guest.with_binds((str(archive), str(archive)))
                say(f"try `qnnctl install --file {archive}`")
            command = argv[1:] or ["/bin/sh"]
            done = subprocess.run(guest.argv(command, cwd=str(REPO)), env=guest.environment(), check=False)
            return done.returncode
    print("usage: python -m tests.emulated build|where|run [CMD...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
