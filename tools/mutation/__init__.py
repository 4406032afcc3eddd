"""Mutation testing of qnnctl's safety modules, run by hand (see tools/mutation/README.md).

    python -m tools.mutation shell              # one module, its own tests, one child process
    python -m tools.mutation shell --retest     # after new tests: the survivors again
    python -m tools.mutation --list             # the modules and the tests each one runs

Each module is mutated on its own, in a folder of its own under `mutants/` (ignored by git),
with only the test files that exercise it; the mutants run under `nice`, one at a time by
default, and a run stops after `--minutes` (what was checked by then is kept and reported).
"""

from __future__ import annotations

from typing import NamedTuple


class Target(NamedTuple):
    """A module to mutate: its source files and the tests that exercise them."""

    sources: tuple[str, ...]
    tests: tuple[str, ...]


TARGETS: dict[str, Target] = {
    "shell": Target(("qnnctl/shell/exports.py", "qnnctl/shell/render.py", "qnnctl/shell/detect.py"),
                    ("tests/shell/test_shell.py", "tests/shell/test_env_cli.py")),
    # The selection module: which SDK, and the environment a process gets for it.
    "selection": Target(("qnnctl/sdk/select.py", "qnnctl/sdk/layout.py", "qnnctl/run/environment.py",
                                    "qnnctl/run/envplan.py"),
                        ("tests/sdk/test_selection.py", "tests/sdk/test_choice.py", "tests/shell/test_env_cli.py",
                         "tests/shell/test_shell.py", "tests/run/test_api.py", "tests/test_first_run.py")),
    "elf": Target(("qnnctl/host/elf.py",), ("tests/host/test_elf.py", "tests/doctor/test_doctor.py")),
    # A body past the size a lock or an index pins, and a server's words shown escaped (test_endless_body,
    # test_server_words), beside the downloader's own tests.
    "download": Target(("qnnctl/net/download.py", "qnnctl/net/body.py"),
                       ("tests/net/test_download.py", "tests/install/test_endless_body.py",
                        "tests/net/test_server_words.py")),
    # The session every request goes through and the retry policy: proxies, tunnels, credentials, redirects,
    # connections, bodies, retries (test_http), and the downloads that use them (test_download).
    "http": Target(("qnnctl/net/http.py", "qnnctl/net/retry.py", "qnnctl/net/failures.py"),
                   ("tests/net/test_http.py", "tests/net/test_download.py", "tests/net/test_server_words.py")),
    # The links and member filter of partial installs, and doctor --verify's digests, are archive's too; so
    # are the modules split from it (its workers, one member's data, extracting while downloading, links).
    "archive": Target(("qnnctl/install/archive.py", "qnnctl/install/pool.py", "qnnctl/install/memberdata.py",
                       "qnnctl/install/stream.py", "qnnctl/install/confine.py", "qnnctl/threads.py"),
                      ("tests/install/test_archive.py", "tests/install/test_stream.py",
                       "tests/install/test_parallel.py", "tests/install/test_partial.py",
                       "tests/sdk/test_components.py", "tests/doctor/test_doctor.py")),
    # install/pipeline.py is the command's core: the resolution of what to install (test_choice), the
    # command line (test_cli), locks and stores (test_fleet), components, redaction and the
    # extraction while downloading (test_stream), the download cut at the size pinned (test_endless_body)
    # reach it too. test_housekeeping (list, use, uninstall,
    # cache clean, prune) runs no install: its kills of the old install.py were all of uninstall and
    # clean_cache, now prune's; here it only cost three runs of its 33 tests (lines, reach, clean run).
    # Nor does test_redaction: its 68 tests are redact's own (a password of every character, in children);
    # the pipeline only passes URLs to redact, and a URL dropped there fails test_install's --url installs.
    "install": Target(("qnnctl/install/pipeline.py",),
                      ("tests/install/test_install.py",
                       "tests/sdk/test_choice.py", "tests/test_cli.py", "tests/fleet/test_fleet.py",
                       "tests/install/test_partial.py", "tests/install/test_stream.py",
                       "tests/test_first_run.py", "tests/install/test_endless_body.py")),
    "api": Target(("qnnctl/run/api.py",), ("tests/run/test_api.py", "tests/run/test_guard.py")),
    "bootstrap": Target(("qnnctl/run/bootstrap.py",),
                        ("tests/run/test_bootstrap.py", "tests/run/test_lower.py", "tests/run/test_guard.py")),
    # The one gate: its rules on their own, then every way in (test_gate), installs by parts (test_partial).
    "gate": Target(("qnnctl/sdk/gate.py",), ("tests/sdk/test_gate.py", "tests/install/test_partial.py")),
    # One reading of a zip, by its own tests (test_components). test_gate's archives built to be read two
    # ways reach it too, through installs that take a minute for each mutant they do not kill; in a first
    # run they killed none that test_components did not.
    "zipindex": Target(("qnnctl/install/zipindex.py",), ("tests/sdk/test_components.py",)),
    # The component rules, choosing members and their digests, by their own tests: test_partial's installs by
    # parts reach them too, and would cost a minute for each mutant they do not kill (as test_gate for zipindex).
    "components": Target(("qnnctl/sdk/components.py", "qnnctl/sdk/members.py"), ("tests/sdk/test_components.py",)),
    # uninstall --except/--all, by the library (test_housekeeping); test_fleet and test_holds run it end to end.
    "prune": Target(("qnnctl/install/prune.py",), ("tests/install/test_housekeeping.py",)),
    # A push to the stand-in adb, in the tests' own process and through `qnnctl device push`.
    "push": Target(("qnnctl/device/push.py",), ("tests/device/test_device.py",)),
    # A mirror's index.json: its limits (size, deadline, nesting) in the tests' own process against the
    # loopback server (test_mirrorindex); read on its own and by installs from a mirror (test_fleet).
    "mirrorindex": Target(("qnnctl/sdk/mirrorindex.py",),
                          ("tests/sdk/test_mirrorindex.py", "tests/fleet/test_fleet.py",
                           "tests/sdk/test_mirror_versions.py")),
    # The commit stage, in the tests' own process and through every install (test_install); an SDK
    # replaced while a pipeline uses it (test_holds).
    "commit": Target(("qnnctl/install/commit.py",), ("tests/install/test_install.py", "tests/sdk/test_holds.py")),
    # qnnctl.lock: read, written and compared in the tests' own process, and by `qnnctl lock` (test_fleet).
    "lockfile": Target(("qnnctl/sdk/lockfile.py",), ("tests/fleet/test_fleet.py",)),
    # Shared stores and links: read in the tests' own process and by every command that selects (test_fleet).
    "stores": Target(("qnnctl/sdk/stores.py",), ("tests/sdk/test_stores.py", "tests/sdk/test_links.py",
                                                  "tests/fleet/test_fleet.py", "tests/sdk/test_selection.py")),
    # `qnnctl lock`, `lock --check` and the notes of `qnnctl use`, in the tests' own process (test_locking);
    # test_fleet runs them through the command line, a child for each, at minutes for each mutant it does
    # not kill: in the first run (221e233) it killed none that test_locking does not.
    "locking": Target(("qnnctl/fleet/locking.py",), ("tests/fleet/test_locking.py",)),
    # The mirror and the archive fetch in the tests' own process (test_mirror); test_fleet's and
    # test_nginx's runs of `qnnctl mirror` and `lock`, a child each, cost minutes for each mutant
    # they do not kill.
    "mirror": Target(("qnnctl/fleet/mirror.py",), ("tests/fleet/test_mirror.py", "tests/fleet/test_mirror_lock.py")),
    # Installs by parts: the module's functions, RangedInstall and install_components in the tests' own
    # process, against the loopback server (test_parts). test_partial's installs through the command line
    # reach them too, at a minute for each mutant they do not kill: in a first run with both, they killed
    # 2 of the 476 mutants killed (a --sha256 the whole download is not given), which test_parts kills now.
    # The one door (door) and an archive on disk opened once (sources): in the tests' own process
    # (test_sources), then through the ways in, built as an attacker would (test_door), and the gate's
    # every way in (test_gate), a child or an install each.
    "door": Target(("qnnctl/install/door.py", "qnnctl/install/sources.py"),
                   ("tests/install/test_sources.py", "tests/install/test_sources_attacks.py",
                    "tests/install/test_door.py", "tests/sdk/test_gate.py")),
    # What counts as evidence about an SDK on disk: a manifest only where qnnctl wrote it, a hashing
    # remembered by the tree's key: in the tests' own process (test_evidence) and through the commands
    # that read an SDK someone else's folder holds (test_door).
    "evidence": Target(("qnnctl/sdk/evidence.py",), ("tests/sdk/test_evidence.py", "tests/install/test_door.py")),
    # Holds on an SDK while a pipeline uses it, and the waits of commands that would remove or replace
    # it: this process's and its children's locks read back from /proc (test_holders), then real
    # pipelines and commands, a child each (test_holds).
    "holds": Target(("qnnctl/sdk/holds.py",), ("tests/sdk/test_holders.py", "tests/sdk/test_holds.py")),
    # The install lock (flock on a file of locks/, never through a link or a FIFO), the work folders
    # beside the cache, and files.py (flock without waiting, shared with holds; the free space a write
    # needs): the lock between processes (test_work_lock), skipped rather than waited for by prune
    # and clean (test_housekeeping), the holds on the same flock (test_holders), the space checks of a
    # download (test_download) and the work folders of installs (test_install).
    "work": Target(("qnnctl/sdk/work.py", "qnnctl/files.py"),
                   ("tests/sdk/test_work_lock.py", "tests/install/test_housekeeping.py", "tests/sdk/test_holders.py",
                    "tests/net/test_download.py", "tests/install/test_install.py")),
    "partial": Target(("qnnctl/install/partial.py",), ("tests/install/test_parts.py",)),
    # Folders made and JSON records written with an exact mode whatever the umask, the size of a folder,
    # paths as users write them: on real files in the tests' own process (test_paths).
    "paths": Target(("qnnctl/paths.py",), ("tests/test_paths.py",)),
    # The ranged reads in the tests' own process, against the loopback server's faults (test_ranged):
    # test_partial's and test_components' installs reach them too, at a minute for each mutant they
    # do not kill, and in mutmut's own run they killed none that test_ranged did not.
    "ranged": Target(("qnnctl/net/ranged.py", "qnnctl/net/sparse.py"), ("tests/net/test_ranged.py",)),
    # libc++ and glibc staged for an SDK and checked before they are loaded: in the tests' process and by commands.
    "runtime": Target(("qnnctl/host/runtime.py", "qnnctl/host/llvm.py", "qnnctl/host/sources.py"),
                      ("tests/host/test_runtime.py", "tests/host/test_runtime_lock.py",
                       "tests/host/test_runtime_lock_attacks.py", "tests/host/test_runtime_trust.py",
                       "tests/host/test_runtime_integration.py")),
    # What a .deb, an RPM, a tar and LLVM's archive may hold before their bytes are read (header bounds,
    # member counts, sizes, names), and the hashing, bounded reads they come through: real archives built
    # in the tests' process, damaged and hostile ones (test_package_damage), and the packages staging
    # reads (test_runtime: .debs, RPMs, tars and folders given with --runtime-from, in the tests' process),
    # and the streams' readers alone, on real streams, at and past their bounds (test_streams).
    "packages": Target(("qnnctl/host/packages.py", "qnnctl/host/streams.py"),
                       ("tests/host/test_packages.py", "tests/host/test_package_damage.py",
                        "tests/host/test_runtime.py", "tests/host/test_streams.py")),
    # adb's answers and a device's files, each bounded, against a stand-in adb that behaves as the real
    # one does, failures included; the device chosen, or refused in adb's and qnnctl's whole words
    # (test_adb_choice); a shell command and the sha256 of files that fail, in whole words too
    # (test_device_commands); how adb is found and run: its environment, its input, its output as text (test_adb_runs).
    "adb": Target(("qnnctl/device/adb.py",), ("tests/device/test_adb_choice.py", "tests/device/test_device_commands.py",
                                              "tests/device/test_adb_runs.py", "tests/device/test_device_bounds.py",
                                              "tests/device/test_device.py")),
}
