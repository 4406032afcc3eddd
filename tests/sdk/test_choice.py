"""The SDK a command chose, in the corners: stray folders, a shell's SDK that has gone, --sha256
and --force against what is installed, hints that keep the choice, a dry run's honesty."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from qnnctl.sdk.vouchers import vouchers
from tests.conftest import run_qnnctl
from tests.httpserver import FaultServer
from tests.sdkfactory import OTHER_VERSION, VERSION, SdkSpec, build_archive, build_sdk_tree, install_tree_into_cache

LIB = "lib/x86_64-linux-clang"


def shell_for(*args: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a shell after `eval "$(qnnctl env ARGS)"`."""
    base = os.environ.copy() if env is None else env
    exported = run_qnnctl("env", *args, "--shell", "json", env=base)
    assert exported.returncode == 0, exported.stderr
    return {**base, **{k: v for k, v in json.loads(exported.stdout).items() if v is not None}}


def test_a_stray_copy_in_the_cache_is_no_sdk_and_breaks_nothing(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    shutil.copytree(root, cache_dir / "sdks" / f"{VERSION}.bak", symlinks=True)
    assert shell_for()["QNN_SDK_ROOT"] == str(root)
    rows = json.loads(run_qnnctl("list", "--json").stdout)["sdks"]
    assert [r["version"] for r in rows] == [VERSION]


def test_sha256_is_checked_whichever_step_chose_the_installed_sdk(mirror: FaultServer, cache_dir: Path,
                                                                  tmp_path: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)  # recorded with no sha256 at all
    wrong = "0" * 64

    def unrecorded(origin: str, sha256: str, source: str = "") -> str:
        return (f"qnnctl: error: SDK {VERSION} at {root} ({origin}) has no recorded sha256, so it cannot be checked "
                f"against {sha256}\nqnnctl: hint: install a checked copy into qnnctl's cache: `qnnctl install "
                f"{VERSION} --force{source} --sha256 {sha256}`\n")

    env_root = {**os.environ, "QNN_SDK_ROOT": str(root)}
    for origin, env in (("qnnctl env", shell_for(VERSION)), ("QNN_SDK_ROOT", env_root)):
        proc = run_qnnctl("install", "--sha256", wrong, env=env)
        assert proc.returncode == 4, proc.stderr
        assert proc.stderr == unrecorded(origin, wrong)
    # The version named, found in qnnctl's cache before any download is thought of.
    proc = run_qnnctl("install", VERSION, "--sha256", wrong)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr == unrecorded("qnnctl cache", wrong)
    # --file of another archive of an installed version: with --sha256 (the file's), the
    # installed SDK must come from it too, and the hint installs that file.
    archive = build_archive(tmp_path, "zip", SdkSpec(extra_files={"docs/other.txt": b"another build"}))
    from qnnctl.net.download import file_sha256

    digest = file_sha256(archive)
    proc = run_qnnctl("install", VERSION, "--file", str(archive), "--sha256", digest)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr == unrecorded("qnnctl cache", digest, f" --file {archive}")
    (tmp_path / "first").mkdir()
    first = build_archive(tmp_path / "first", "zip")
    assert run_qnnctl("install", VERSION, "--force", "--file", str(first)).returncode == 0
    proc = run_qnnctl("install", VERSION, "--file", str(archive), "--sha256", digest)
    assert proc.returncode == 4, proc.stderr
    replace = f"qnnctl install {VERSION} --force --file {archive} --sha256 {digest}"
    assert proc.stderr == (f"qnnctl: error: SDK {VERSION} is installed from an archive whose sha256 is "
                           f"{file_sha256(first)}, not {digest}\nqnnctl: hint: check the --sha256 value; to replace "
                           f"the SDK with the archive that has it: `{replace}`\n")
    plain = run_qnnctl("install", VERSION, "--file", str(archive))
    assert plain.returncode == 0, plain.stderr
    assert "installed already, from another archive" in plain.stderr
    assert f"`qnnctl install {VERSION} --force --file {archive}` replaces it" in plain.stderr
    # The command the hint gives does what it says: afterwards, the first command passes.
    assert run_qnnctl(*replace.split()[1:]).returncode == 0
    again = run_qnnctl("install", VERSION, "--file", str(archive), "--sha256", digest)
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"{root}\n"
    assert "warning" not in again.stderr  # installed from this very archive: nothing to say about it
    assert mirror.requests == []


def test_a_shell_whose_sdk_is_gone_says_so_and_install_puts_it_back(mirror: FaultServer, cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    shell = shell_for(VERSION)
    shutil.rmtree(root)
    lowered = run_qnnctl("lower", "--", "true", env=shell)
    assert lowered.returncode == 1, lowered.stderr
    assert f"this shell was set up by `qnnctl env` for the SDK at {root}, which is gone" in lowered.stderr
    assert f"`qnnctl install {VERSION}` to put it back" in lowered.stderr
    # A dry run stops where the real run does, with the same words.
    planned = run_qnnctl("lower", "--dry-run", "--", "true", env=shell)
    assert planned.returncode == 1, planned.stderr
    assert planned.stdout == ""
    assert planned.stderr == (f"qnnctl: error: this shell was set up by `qnnctl env` for the SDK at {root}, which "
                              f"is gone\nqnnctl: hint: `qnnctl install {VERSION}` to put it back, or "
                              '`eval "$(qnnctl env)"` to set the shell up for another SDK\n')
    assert mirror.requests == []
    again = run_qnnctl("install", env=shell)
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"{root}\n"
    assert run_qnnctl("lower", "--", "true", env=shell).returncode == 0


def test_a_shell_whose_sdk_outside_the_cache_is_gone_says_so_and_install_installs_nothing(
        mirror: FaultServer, tmp_path: Path) -> None:
    """`qnnctl install VERSION` would not put /opt/qairt/VERSION back: the hint does not offer it."""
    for name in ("qairt", VERSION):
        vendor = build_sdk_tree(tmp_path / "vendor" / name)
        shell = shell_for("--sdk", str(vendor))
        shutil.rmtree(vendor)
        proc = run_qnnctl("install", env=shell)
        assert proc.returncode == 1, proc.stderr
        assert proc.stdout == ""
        assert proc.stderr == (f"qnnctl: error: this shell was set up by `qnnctl env` for the SDK at {vendor}, "
                               'which is gone\nqnnctl: hint: `eval "$(qnnctl env)"` to set the shell up for '
                               "another SDK\n")
    assert mirror.requests == []


def test_force_in_a_shell_set_up_for_a_folder_that_is_no_sdk_of_the_cache_is_refused(
        mirror: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    places = {
        build_sdk_tree(tmp_path / "vendor" / "qairt"): "outside qnnctl's cache",
        # Named as a version, but not in the cache's sdks/.
        build_sdk_tree(tmp_path / "vendor" / VERSION): "outside qnnctl's cache",
        # In sdks/, but not named as a version.
        build_sdk_tree(cache_dir / "sdks" / f"{VERSION}.old"): "inside qnnctl's cache, not one of its SDKs",
    }
    for root, place in places.items():
        proc = run_qnnctl("install", "--force", env=shell_for("--sdk", str(root)))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (f"qnnctl: error: this shell was set up by `qnnctl env` for {root}, {place}; --force "
                               "reinstalls an SDK of qnnctl's cache by VERSION\nqnnctl: hint: give the VERSION to "
                               "reinstall (`qnnctl install --force VERSION`)\n")
    assert mirror.requests == []


def test_force_in_a_shell_set_up_for_an_sdk_of_the_cache_reinstalls_it_for_the_same_reason(
        mirror: FaultServer, cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    proc = run_qnnctl("-v", "install", "--force", env=shell_for(VERSION))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{root}\n"
    assert mirror.requests_for(f"/{VERSION}/v{VERSION}.zip")
    # -v says why: the shell's SDK, chosen by its folder, then by its version, for the same reason.
    by_root, by_version = (line for line in proc.stderr.splitlines() if line.startswith("qnnctl: chose "))
    assert by_version == by_root.replace(str(root), VERSION, 1)


def test_doctor_hint_for_a_stale_shell_keeps_the_sdk_it_was_set_up_for(cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    other = install_tree_into_cache(cache_dir, OTHER_VERSION)
    shell = shell_for(OTHER_VERSION)
    shell["LD_LIBRARY_PATH"] = "/somewhere/else"
    report = json.loads(run_qnnctl("doctor", "--json", "--offline", env=shell).stdout)
    environment = next(c for c in report["checks"] if c["id"] == "environment")
    assert environment["status"] == "warn"
    assert environment["hint"].startswith(f'eval "$(qnnctl env --sdk {other})"')


def test_a_damaged_sdk_installed_from_a_file_is_repaired_from_that_file(cache_dir: Path, tmp_path: Path) -> None:
    archive = build_archive(tmp_path, "zip")
    assert run_qnnctl("install", "--file", str(archive)).returncode == 0
    (cache_dir / "sdks" / VERSION / LIB / "libQnnSystem.so").unlink()
    proc = run_qnnctl("env", VERSION)
    assert proc.returncode == 1
    assert "is damaged" in proc.stderr
    assert f"`qnnctl install --force --file {archive}`" in proc.stderr


def test_a_dry_run_checks_the_mirror_and_keeps_every_note_line_a_comment(cache_dir: Path,
                                                                         tmp_path: Path) -> None:
    bad = run_qnnctl("lower", "--dry-run", "--sdk", "2.40.0.251030", "--", "true",
                     env={**os.environ, "QNNCTL_MIRROR": "ftp://mirror.example/qairt"})
    assert bad.returncode == 2, bad.stderr
    assert "not ftp:" in bad.stderr
    broken = run_qnnctl("lower", "--dry-run", "--sdk", "2.40.0.251030", "--", "true",
                        env={**os.environ, "QNNCTL_MIRROR": "https://mirror.example/q\necho INJECTED"})
    assert broken.returncode == 2, broken.stderr
    # A damaged SDK is said to be damaged, and every line of the plan before the exports is a comment.
    root = install_tree_into_cache(cache_dir, VERSION)
    (root / LIB / "libQnnSystem.so").unlink()
    # Behind a mirror it cannot reach, the dry run stops where `install` would: at its index.
    unreachable = run_qnnctl("lower", "--dry-run", "--sdk", VERSION, "--", "true",
                             env={**os.environ, "QNNCTL_MIRROR": "https://mirror.example/qairt"})
    assert unreachable.returncode == 3, unreachable.stderr
    assert "cannot reach the mirror: https://mirror.example/qairt/index.json" in unreachable.stderr
    plan = run_qnnctl("lower", "--dry-run", "--sdk", VERSION, "--", "true")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.startswith(f"# SDK {VERSION} is damaged (missing {LIB}/libQnnSystem.so)")
    ran = subprocess.run(["sh", "-c", plan.stdout.replace("\ntrue\n", "\necho planned\n")],
                         capture_output=True, text=True, timeout=30)
    assert ran.stdout == "planned\n", ran.stdout + ran.stderr


def test_which_refuses_a_name_no_file_system_takes(cache_dir: Path) -> None:
    proc = run_qnnctl("which", "lib" + "x" * 300 + ".so")
    assert proc.returncode == 2
    assert "not a bare library or tool name" in proc.stderr


def test_setup_sdk_interrupted_while_staging_leaves_the_variables_as_they_were(cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    script = f"""
import os, qnnctl, qnnctl.run.environment
def interrupted(*args):
    os.environ["LD_LIBRARY_PATH"] = "/half/done"
    raise KeyboardInterrupt
qnnctl.run.environment.ensure_loadable = interrupted
try:
    qnnctl.setup_sdk({VERSION!r})
except KeyboardInterrupt:
    print(os.environ.get("QNN_SDK_ROOT"), os.environ.get("LD_LIBRARY_PATH"))
"""
    env = {**os.environ, "LD_LIBRARY_PATH": "/kept"}
    env.pop("QNN_SDK_ROOT", None)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout == "None /kept\n", proc.stdout + proc.stderr


def test_a_dry_run_note_that_holds_a_newline_stays_a_comment(tmp_path: Path) -> None:
    project = tmp_path / "proj\necho INJECTED #"
    project.mkdir()
    (project / ".qnn-version").write_text("2.40.0.251030\n")
    plan = run_qnnctl("lower", "--dry-run", "--", "true", cwd=project)
    assert plan.returncode == 0, plan.stderr
    ran = subprocess.run(["sh", "-c", plan.stdout], capture_output=True, text=True, timeout=30)
    assert "INJECTED" not in ran.stdout, plan.stdout


def test_install_without_a_version_reuses_the_newest_sdk_installed(mirror: FaultServer, cache_dir: Path) -> None:
    """No version, no QNN_SDK_ROOT, pin or ExecuTorch: the newest SDK on disk, not the default."""
    newer = "2.40.0.251030"
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    root = install_tree_into_cache(cache_dir, newer)
    proc = run_qnnctl("-v", "install")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{root}\n"
    assert f"chose SDK {newer} (installed: the newest SDK already installed)" in proc.stderr
    assert mirror.requests == []


def _reused_by_install(cache_dir: Path, env: dict[str, str], root: Path, said: str, reason: str) -> None:
    """`qnnctl install` with no VERSION in `env` reuses the SDK at `root`, saying where it was
    found, and install() returns it with the step of the selection that chose it."""
    from qnnctl.install.pipeline import InstallRequest, install
    from qnnctl.sdk.cache import Cache

    install_tree_into_cache(cache_dir, "2.40.0.251030")  # newer, and not the one to reuse
    proc = run_qnnctl("install", env=env)
    assert (proc.returncode, proc.stdout) == (0, f"{root}\n"), proc.stderr
    assert proc.stderr == f"qnnctl: SDK {VERSION} {said}\n"
    found = install(InstallRequest(), Cache(cache_dir), env, Path.cwd(), vouchers(env, Path.cwd()))
    assert (found.sdk is not None and found.sdk.root, found.action) == (root, "reused")
    assert found.selection is not None
    assert found.selection.reason == reason


def test_install_in_a_shell_set_up_by_env_reuses_its_sdk(mirror: FaultServer, cache_dir: Path) -> None:
    """The SDK `qnnctl env` set this shell up for, not the newest installed."""
    from qnnctl.sdk.select import BY_SHELL

    root = install_tree_into_cache(cache_dir, VERSION)
    _reused_by_install(cache_dir, shell_for(VERSION), root,
                      "is the one this shell was set up for (`qnnctl env`): nothing to install", BY_SHELL)
    assert mirror.requests == []


def test_install_with_the_users_sdk_root_reuses_it(mirror: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    """A QNN_SDK_ROOT of the user's, outside the cache: reused as it is, nothing fetched."""
    from qnnctl.sdk.select import BY_ENV

    root = tmp_path / "users-sdk"
    build_sdk_tree(root, SdkSpec(version=VERSION))
    _reused_by_install(cache_dir, {**os.environ, "QNN_SDK_ROOT": str(root)}, root,
                      "is the one QNN_SDK_ROOT names: nothing to install", BY_ENV)
    assert mirror.requests == []


def test_a_pinned_prefix_is_looked_up_in_what_the_mirror_holds(mirror: FaultServer, cache_dir: Path,
                                                                tmp_path: Path) -> None:
    """A project's `.qnn-version` of `2.37` behind a mirror: the newest 2.37 the mirror's index
    lists, as for `qnnctl install 2.37`, not the newest 2.37 qnnctl knows of (which the mirror
    may not hold, and `install` would then refuse)."""
    listed = "2.37.9.260101"
    made = run_qnnctl("mirror", str(tmp_path / "made"), VERSION)
    assert made.returncode == 0, made.stderr
    index = json.loads((tmp_path / "made" / "index.json").read_text())
    index["versions"] = {listed: index["versions"][VERSION]}
    mirror.add("/index.json", json.dumps(index).encode(), "application/json")
    project = tmp_path / "project"
    project.mkdir()
    (project / ".qnn-version").write_text("2.37\n")
    proc = run_qnnctl("install", "-v", cwd=project)
    assert f"chose SDK {listed} (pinned in {project / '.qnn-version'})" in proc.stderr, proc.stderr
    assert mirror.requests_for(f"/{listed}/v{listed}.zip") != []  # not served there: exit 3, as for 2.37 itself
    assert proc.returncode == 3, proc.stderr


def test_the_projects_lock_is_checked_whichever_step_chose_the_installed_sdk(mirror: FaultServer, cache_dir: Path,
                                                                              tmp_path: Path) -> None:
    """`qnnctl install` without a version reuses the SDK this shell was set up for, or the one
    QNN_SDK_ROOT names: in a project with a qnnctl.lock, that SDK is held to the lock as any other
    is (exit 4 when it came from another archive), not taken because the shell named it."""
    project = tmp_path / "project"
    project.mkdir()
    for args in (("install", VERSION), ("use", VERSION), ("lock",)):
        done = run_qnnctl(*args, cwd=project)
        assert done.returncode == 0, done.stderr
    root = cache_dir / "sdks" / VERSION
    env_root = {**os.environ, "QNN_SDK_ROOT": str(root)}
    shells = {"qnnctl env": shell_for(VERSION), "QNN_SDK_ROOT": env_root}
    for origin, env in shells.items():
        matching = run_qnnctl("install", env=env, cwd=project)
        assert (matching.returncode, matching.stdout) == (0, f"{root}\n"), (origin, matching.stderr)
    manifest_path = root / ".qnnctl.json"
    manifest_path.write_text(json.dumps({**json.loads(manifest_path.read_text()), "sha256": "0" * 64}))
    for origin, env in shells.items():
        other = run_qnnctl("install", env=env, cwd=project)
        assert (other.returncode, other.stdout) == (4, ""), (origin, other.stderr)
        assert "0" * 64 in other.stderr, (origin, other.stderr)
