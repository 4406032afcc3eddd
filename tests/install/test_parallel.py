"""pool.in_processes: jobs shared between this process and forked children.

Each case runs in a fresh interpreter: whether qnnctl forks depends on the process having a
single thread, which a test runner's own threads would decide otherwise.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import give_default_acl, with_default_sigint
from tests.install.test_archive import PAYLOAD_SPEC, garble_deflate
from tests.sdkfactory import SdkSpec, build_archive, manifest_digest

# Their outcome depends on the standard library (fork, pipes and signals).
pytestmark = pytest.mark.stdlib

PRELUDE = """
import errno, json, os, sys, threading, time
from qnnctl.install.pool import in_processes
"""


# A script that extracts sys.argv[1] into sys.argv[2], in threads if sys.argv[3] is "True"
# (this process then runs a second thread), with qnnctl's debug messages on stderr.
EXTRACT = """
import logging, threading
from pathlib import Path
from qnnctl.install.archive import extract
from qnnctl.errors import IntegrityError
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
if sys.argv[3] == "True":
    idle = threading.Event()
    threading.Thread(target=idle.wait, daemon=True).start()
"""


def _run(body: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout)


def _ok(body: str, *args: str) -> str:
    ran = _run(body, *args)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def _child_failure(definitions: str) -> str:
    """What in_processes raises (a RuntimeError's text) for jobs 0 and 1 of `definitions`'
    `run(job, stop)`, job 1 done by a forked child; nothing when it raises nothing."""
    return _ok(textwrap.dedent(definitions) + textwrap.dedent("""
        try:
            in_processes([0, 1], run, weight=lambda job: 10 - job, workers=2)
        except RuntimeError as exc:
            print(exc)
    """))


def _start(body: str, folder: Path, stdout: int | None = None) -> subprocess.Popen[str]:
    """The script `body` in a fresh interpreter, with `folder` (where its workers leave
    their pids) as its argument."""
    code = PRELUDE + textwrap.dedent(body)
    # SIGINT at its default: one test interrupts the script.
    return subprocess.Popen(with_default_sigint([sys.executable, "-c", code, str(folder)]), text=True,
                            stdout=stdout)


def _files(folder: Path, count: int) -> list[str]:
    """The names in `folder`, once there are `count` of them (or 30 s have passed)."""
    deadline = time.monotonic() + 30
    while len(os.listdir(folder)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return os.listdir(folder)


def _gone(pid: int) -> bool:
    """Whether `pid` no longer runs (reaped, or a zombie left for init to reap)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return "\nState:\tZ" in status


def _wait_gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.02)
    return False


def test_a_childs_results_larger_than_a_pipe_read_arrive_whole() -> None:
    """A child's results can be larger than one read of its pipe (64 KiB): all its pieces are
    joined as they came."""
    out = _ok("""
        results = in_processes([0, 1], lambda job, stop: str(job) * 300_000,
                               weight=lambda job: 1, workers=2)
        print(json.dumps({str(job): (len(text), set(text) == {str(job)}) for job, text in results.items()}))
    """)
    assert json.loads(out) == {"0": [300_000, True], "1": [300_000, True]}


def test_every_job_gets_an_event_that_says_stop_in_this_process_and_in_the_children() -> None:
    out = _ok("""
        results = in_processes([0, 1, 2, 3], lambda job, stop: (stop.is_set(), os.getpid()),
                               weight=lambda job: 1, workers=2)
        print(sorted(seen for seen, _ in results.values()), len({pid for _, pid in results.values()}))
    """)
    assert out == "[False, False, False, False] 2\n"


def test_jobs_are_shared_between_processes() -> None:
    out = _ok("""
        results = in_processes(list(range(40)), lambda job, stop: (job * job, os.getpid()),
                               weight=lambda job: job, workers=3)
        print(json.dumps({"me": os.getpid(), "results": results}))
    """)
    data = json.loads(out)
    results = {int(job): value for job, value in data["results"].items()}
    assert sorted(results) == list(range(40))
    assert all(square == job * job for job, (square, _) in results.items())
    pids = {pid for _, pid in results.values()}
    assert len(pids) == 3
    assert data["me"] in pids


def test_shares_weigh_about_the_same() -> None:
    out = _ok("""
        jobs = [10] * 100 + [1000]  # the heavy one last: in_processes deals the heaviest first
        results = in_processes(list(range(len(jobs))), lambda job, stop: os.getpid(),
                               weight=lambda job: jobs[job], workers=2)
        heavy = results[100]
        print(sum(1 for job, pid in results.items() if pid == heavy))
    """)
    assert out.strip() == "1"  # the heavy job alone on one side, the hundred light ones on the other


def test_each_job_goes_to_the_share_that_weighs_least_so_far() -> None:
    """Weights 5, 4, 3, 3 in two shares: 5 | 4, then 3 to the 4 (7), then 3 to the 5 (8)."""
    out = _ok("""
        weights = {"a": 5, "b": 4, "c": 3, "d": 3}
        results = in_processes(list(weights), lambda job, stop: os.getpid(), weight=weights.__getitem__,
                               workers=2)
        mine = sorted(job for job, pid in results.items() if pid == os.getpid())
        print(mine, sorted(job for job in results if job not in mine))
    """)
    assert out == "['a', 'd'] ['b', 'c']\n"


def test_a_threaded_process_uses_threads() -> None:
    out = _ok("""
        idle = threading.Event()
        threading.Thread(target=idle.wait, daemon=True).start()
        results = in_processes(list(range(10)), lambda job, stop: os.getpid(),
                               weight=lambda job: 1, workers=2)
        idle.set()
        print(set(results.values()) == {os.getpid()})
    """)
    assert out.strip() == "True"


def test_threads_run_jobs_at_once_in_named_daemon_threads() -> None:
    """`threads` threads, this one included: it starts `threads - 1` helpers, named (as a stack
    dump shows them) and daemons (a Ctrl-C that ends this one is not kept waiting for them)."""
    out = _ok("""
        from qnnctl.install.pool import in_threads
        started = []
        start = threading.Thread.start
        def counted(thread):
            started.append((thread.name, thread.daemon))
            start(thread)
        threading.Thread.start = counted
        together = threading.Barrier(3, timeout=5)  # passed only by three jobs running at once
        in_threads(range(3), lambda job, stop: together.wait(), threads=3)
        print(json.dumps(started))
    """)
    assert json.loads(out) == [["qnnctl-extract-0", True], ["qnnctl-extract-1", True]]


def test_in_threads_hands_each_job_the_stop_event_and_raises_the_first_failure() -> None:
    """In this process: a job that fails sets the event the others were handed, and its own
    exception, not another, is what in_threads raises once every thread has ended."""
    from qnnctl.install.pool import in_threads

    failed = threading.Event()
    saw: list[bool] = []

    def run(job: int, stop: threading.Event) -> None:
        if job == 1:
            failed.set()
            raise ValueError("job 1 failed")
        failed.wait(10)
        saw.append(stop.wait(10))

    with pytest.raises(ValueError, match="job 1 failed"):
        in_threads([0, 1], run, threads=2)
    assert saw == [True]


def test_in_threads_a_failure_tells_the_other_jobs_to_stop() -> None:
    """A threaded process works in threads: the jobs still get the event that says stop."""
    out = _ok("""
        idle = threading.Event()
        threading.Thread(target=idle.wait, daemon=True).start()
        failed = threading.Event()
        saw = []
        def run(job, stop):
            if job == 1:
                failed.set()
                raise ValueError("job 1 failed")
            failed.wait(10)
            saw.append(stop.wait(10))
        try:
            in_processes([0, 1], run, weight=lambda job: 1, workers=2)
        except ValueError as exc:
            print(exc, saw)
    """)
    assert out == "job 1 failed [True]\n"


def test_a_childs_exception_is_raised_in_the_parent() -> None:
    ran = _run("""
        def run(job, stop):
            if job == 1:
                raise OSError(errno.ENOSPC, "No space left on device", "/work/x/lib/libA.so")
            return os.getpid()
        try:
            in_processes([0, 1], run, weight=lambda job: 10 - job, workers=2)  # job 1: the child's
        except OSError as exc:
            print(exc.errno == errno.ENOSPC, exc.filename)
    """)
    assert (ran.returncode, ran.stdout) == (0, "True /work/x/lib/libA.so\n"), ran.stderr
    assert ran.stderr == ""  # the child that failed ended there: none of the caller's code ran again in it


def test_an_exception_that_does_not_pickle_still_reaches_the_parent() -> None:
    out = _child_failure("""
        class Odd(Exception):
            def __init__(self, what, hook):
                super().__init__(what)
                self.hook = hook
        def run(job, stop):
            if job == 1:
                raise Odd("member libB.so is odd", lambda: None)
            return job
    """)
    assert out == "Odd: member libB.so is odd\n"


def test_an_exception_that_pickles_but_does_not_unpickle_still_reaches_the_parent() -> None:
    """Pickled, it is made again from its args: one whose __init__ wants more cannot be."""
    out = _child_failure("""
        class Placed(Exception):
            def __init__(self, what, where):
                super().__init__(what)
                self.where = where
        def run(job, stop):
            if job == 1:
                raise Placed("member libB.so is odd", "/work/x")
            return job
    """)
    assert out == "Placed: member libB.so is odd\n"


def test_a_child_that_cannot_tell_its_failure_ends_with_status_1() -> None:
    """Its exception neither pickles nor turns into text: nothing reaches the parent but the
    child's end, exit status 1."""
    out = _child_failure("""
        class Mute(Exception):
            def __init__(self, hook):
                super().__init__()
                self.hook = hook
            def __str__(self):
                raise ValueError("no text")
        def run(job, stop):
            if job == 1:
                raise Mute(lambda: None)
            return job
    """)
    assert out == "an extraction process ended without a result (exit status 1)\n"


def test_a_child_that_cannot_send_its_results_ends_with_status_0() -> None:
    """Its share done, but the results neither pickle nor turn into text: the parent learns
    only that the child ended, with exit status 0."""
    out = _child_failure("""
        class Mute:
            def __reduce__(self):
                raise TypeError("no pickle")
            def __repr__(self):
                raise ValueError("no text")
        def run(job, stop):
            return Mute() if job == 1 else job
    """)
    assert out == "an extraction process ended without a result (exit status 0)\n"


def test_a_child_killed_by_a_signal_is_reported_so() -> None:
    out = _child_failure("""
        import signal
        def run(job, stop):
            if job == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return job
    """)
    assert out == "an extraction process ended without a result (killed by SIGKILL)\n"


# An application's SIGCHLD handler that reaps every child that ends (the status is then its),
# and job 0 (this process's share) that waits until it has reaped job 1's child.
REAPING = """
import contextlib, signal
reaped = []
def reap(signum, frame):
    with contextlib.suppress(ChildProcessError):
        while (pid := os.waitpid(-1, os.WNOHANG)[0]) > 0:
            reaped.append(pid)
signal.signal(signal.SIGCHLD, reap)
def wait_reaped():
    deadline = time.monotonic() + 30
    while not reaped and time.monotonic() < deadline:
        time.sleep(0.01)
"""


def test_a_child_reaped_by_the_applications_handler_is_reported_so() -> None:
    out = _child_failure(REAPING + textwrap.dedent("""
        def run(job, stop):
            if job == 1:
                os._exit(3)  # no result sent
            wait_reaped()
            return job
    """))
    assert out == "an extraction process ended without a result (its exit status went to another handler of SIGCHLD)\n"


def test_a_failing_parent_reports_its_error_when_its_child_was_reaped_elsewhere() -> None:
    """The children are stopped after this process's own share fails: one that has ended and
    that the application's handler reaped is no longer there to stop."""
    out = _ok(REAPING + textwrap.dedent("""
        def run(job, stop):
            if job == 0:
                wait_reaped()
                raise ValueError("the parent's member is corrupt")
            return job
        try:
            in_processes([0, 1], run, weight=lambda job: 10 - job, workers=2)
        except ValueError as exc:
            print(exc, len(reaped))
    """))
    assert out == "the parent's member is corrupt 1\n"


def test_the_pipe_of_a_child_is_closed_when_it_got_descriptor_0() -> None:
    """With no stdin (a daemon's, a service's), a child's pipe can be descriptor 0."""
    out = _ok("""
        os.close(0)
        before = len(os.listdir("/proc/self/fd"))
        results = in_processes([0, 1], lambda job, stop: job, weight=lambda job: 1, workers=2)
        print(results == {0: 0, 1: 1}, len(os.listdir("/proc/self/fd")) - before)
    """)
    assert out.split() == ["True", "0"]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_is_left_as_it_was(enabled: bool) -> None:
    """Disabled for the fork (a child never collects), then on again only if it was on."""
    out = _ok(f"""
        import gc
        gc.enable() if {enabled} else gc.disable()
        in_processes([0, 1], lambda job, stop: job, weight=lambda job: 1, workers=2)
        print(gc.isenabled())
    """)
    assert out.strip() == str(enabled)


def test_a_failing_parent_kills_its_children(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    started = time.monotonic()
    out = _ok("""
        folder = sys.argv[1]
        def run(job, stop):
            if job == 0:  # the parent's share: fail once the child is busy
                while not os.listdir(folder):
                    time.sleep(0.01)
                raise ValueError("the parent's member is corrupt")
            open(os.path.join(folder, str(os.getpid())), "w").close()
            time.sleep(60)
        try:
            in_processes([0, 1], run, weight=lambda job: 10 - job, workers=2)
        except ValueError as exc:
            print(exc)
        (child,) = os.listdir(folder)
        print("running" if os.path.exists(f"/proc/{child}") else "reaped")
    """, str(pids))
    # Reaped before the error reached the caller, not left running until this process ends.
    assert out.split("\n")[:2] == ["the parent's member is corrupt", "reaped"]
    assert time.monotonic() - started < 30


def test_interrupting_the_parent_while_it_waits_stops_its_children(tmp_path: Path) -> None:
    """Ctrl-C sent to qnnctl alone (not to its process group) while a child still works."""
    pids = tmp_path / "pids"
    pids.mkdir()
    parent = _start("""
        folder = sys.argv[1]
        def run(job, stop):
            if job == 1:
                open(os.path.join(folder, str(os.getpid())), "w").close()
                time.sleep(60)
        try:
            in_processes([0, 1], run, weight=lambda job: 10 - job, workers=2)
        except KeyboardInterrupt:
            (child,) = os.listdir(folder)
            print("running" if os.path.exists(f"/proc/{child}") else "reaped", flush=True)
    """, pids, stdout=subprocess.PIPE)
    try:
        assert _files(pids, 1)
        time.sleep(0.2)  # the parent's own share is done: it waits for the child
        parent.send_signal(signal.SIGINT)
        out, _ = parent.communicate(timeout=30)
    finally:
        parent.kill()
    assert out.strip() == "reaped"


def test_interrupting_the_threads_while_this_one_waits_for_a_helper_raises_it_once_they_stop(
        tmp_path: Path) -> None:
    """Ctrl-C while this thread, its jobs done, waits for a helper still working: the helpers are
    told to stop, and the KeyboardInterrupt is raised here once they have."""
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = _start("""
        from qnnctl.install.pool import in_threads
        folder = sys.argv[1]
        helper_busy = threading.Event()
        def jobs():
            yield "a"
            yield "b"
            open(os.path.join(folder, "drained"), "w").close()  # asked by this thread: it is done
        def run(job, stop):
            if threading.current_thread() is threading.main_thread():
                helper_busy.wait(30)
                return
            helper_busy.set()
            while not stop.is_set():
                time.sleep(0.01)
            open(os.path.join(folder, "stopped"), "w").close()
        try:
            in_threads(jobs(), run, threads=2)
            print("returned", flush=True)
        except KeyboardInterrupt:
            print("interrupted", sorted(os.listdir(folder)), flush=True)
    """, marks, stdout=subprocess.PIPE)
    try:
        assert _files(marks, 1) == ["drained"]
        time.sleep(0.2)  # from asking for a job to waiting for the helper
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert out == "interrupted ['drained', 'stopped']\n"


def test_children_die_with_a_killed_parent(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    parent = _start("""
        folder = sys.argv[1]
        def run(job, stop):
            open(os.path.join(folder, f"{job}-{os.getpid()}"), "w").close()
            time.sleep(60)
        in_processes([0, 1], run, weight=lambda job: 10 - job, workers=2)
    """, pids)
    try:
        written = dict(name.split("-") for name in _files(pids, 2))
        assert set(written) == {"0", "1"}
        child = int(written["1"])
        assert child != parent.pid
        assert not _gone(child)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert _wait_gone(child), "the forked worker outlived its killed parent"


@pytest.mark.parametrize("threads", [False, True])
def test_extraction_is_the_same_in_processes_and_in_threads(tmp_path: Path, threads: bool) -> None:
    """The same tree, modes and manifest digests whichever way the members were shared out."""
    many = {f"share/d{i % 5}/f{i}.bin": os.urandom(64) * (i % 50 + 1) for i in range(400)}
    archive = build_archive(tmp_path, "zip", SdkSpec(extra_files=many))
    ran = _run(EXTRACT + textwrap.dedent("""
        result = extract(Path(sys.argv[1]), Path(sys.argv[2]))
        tree = {}
        for path in sorted(result.root.rglob("*")):
            if path.is_file() and not path.is_symlink():
                tree[str(path.relative_to(result.root))] = [oct(path.stat().st_mode), path.read_bytes().hex()]
        print(json.dumps({"files": result.files, "tree": tree}))
    """), str(archive), str(tmp_path / f"x-{threads}"), str(threads))
    assert ran.returncode == 0, ran.stderr
    assert re.search(r"\d+ jobs in 2 threads" if threads else r"\d+ jobs in 2 processes", ran.stderr), ran.stderr
    data = json.loads(ran.stdout)
    assert set(data["files"]) == set(data["tree"])
    for rel, (_, content) in data["tree"].items():
        assert data["files"][rel] == manifest_digest(bytes.fromhex(content)), rel
    for rel, data_bytes in many.items():
        assert bytes.fromhex(data["tree"][rel][1]) == data_bytes
    tool = data["tree"]["bin/x86_64-linux-clang/qnn-net-run"]
    assert int(tool[0], 8) & 0o777 == 0o755


@pytest.mark.parametrize("threads", [False, True])
def test_a_member_that_does_not_inflate_is_an_integrity_error(tmp_path: Path, threads: bool) -> None:
    """ISA-L's error is not zlib's and does not pickle: a worker reports it as a corrupt member."""
    archive = garble_deflate(build_archive(tmp_path, "zip", PAYLOAD_SPEC))
    out = _ok(EXTRACT + textwrap.dedent("""
        try:
            extract(Path(sys.argv[1]), Path(sys.argv[2]))
        except IntegrityError as exc:
            print(exc.exit_code, exc.message)
    """), str(archive), str(tmp_path / "x"), str(threads))
    assert out.startswith("4 "), out
    assert "corrupt or truncated" in out
    assert "docs/text.txt" in out


def test_a_refused_fork_leaves_the_share_to_this_process() -> None:
    """fork() can fail (a pids cgroup limit, no memory): the work is done all the same."""
    out = _ok("""
        def refuse():
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        os.fork = refuse
        before = len(os.listdir("/proc/self/fd"))
        results = in_processes(list(range(20)), lambda job, stop: (job, os.getpid()),
                               weight=lambda job: 1, workers=3)
        print(sorted(results) == list(range(20)), {pid for _, pid in results.values()} == {os.getpid()},
              len(os.listdir("/proc/self/fd")) - before)
    """)
    assert out.split() == ["True", "True", "0"]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000, "default ACL"])
def test_files_get_the_installed_modes_exactly(tmp_path: Path, umask: int | str) -> None:
    """Files are created with their final mode (0755 where the archive gives an exec bit, else
    0644: never writable by others, never less than readable); fchmod() only where the system
    took bits away, which a default ACL on the folder does in place of the umask."""
    import zipfile

    from tests.sdkfactory import add_zip_entry

    modes = {"bin/tool": 0o755, "lib/x86_64-linux-clang/libx.so": 0o644, "etc/secret": 0o600, "share/open": 0o666,
             "bin/group-tool": 0o775}
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for rel, mode in modes.items():
            add_zip_entry(zf, f"qairt/2.37.0.250724/{rel}", b"x" * 100, 0o100000 | mode)
    work = tmp_path / "w"
    work.mkdir()
    if umask == "default ACL":
        give_default_acl(work)  # the umask is then ignored
    out = _ok("""
        import json
        from pathlib import Path
        from qnnctl.install.archive import extract
        os.umask(int(sys.argv[2], 8))
        root = extract(Path(sys.argv[1]), Path(sys.argv[3]) / "x").root
        print(json.dumps({str(p.relative_to(root)): p.stat().st_mode & 0o777
                          for p in root.rglob("*") if p.is_file()}))
    """, str(archive), "022" if umask == "default ACL" else oct(int(umask))[2:], str(work))
    assert json.loads(out) == {rel: 0o755 if mode & 0o111 else 0o644 for rel, mode in modes.items()}
