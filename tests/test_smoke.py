from __future__ import annotations

from pathlib import Path

from tests.conftest import run_qnnctl
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import VERSION, build_archive


def test_install_from_file_then_env(tmp_path: Path, cache_dir: Path) -> None:
    archive = build_archive(tmp_path, "zip")
    result = run_qnnctl("install", "--file", str(archive))
    assert result.returncode == 0, result.stderr
    root = Path(result.stdout.strip())
    assert root == cache_dir / "sdks" / VERSION
    assert (root / "bin/x86_64-linux-clang/qnn-net-run").stat().st_mode & 0o111
    assert (root / "lib/x86_64-linux-clang/libQnnHtp.so.2").is_symlink()


def test_install_from_mirror_twice_second_makes_no_request(mirror: FaultServer, cache_dir: Path) -> None:
    path = f"/{VERSION}/v{VERSION}.zip"
    first = run_qnnctl("install")
    assert first.returncode == 0, first.stderr
    assert len(mirror.requests_for(path)) == 1
    second = run_qnnctl("install")
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert len(mirror.requests_for(path)) == 1


def test_resume_after_drop(mirror: FaultServer, cache_dir: Path) -> None:
    path = f"/{VERSION}/v{VERSION}.zip"
    mirror.fail(path, Fault.drop_after(300_000))
    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    reqs = mirror.requests_for(path)
    assert len(reqs) == 2
    offset = int(reqs[1].headers["Range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < offset <= 300_000
