from __future__ import annotations

from pathlib import Path

from tests.conftest import run_qnnctl
from tests.sdkfactory import VERSION, build_archive


def test_install_from_file_then_env(tmp_path: Path, cache_dir: Path) -> None:
    archive = build_archive(tmp_path, "zip")
    result = run_qnnctl("install", "--file", str(archive))
    assert result.returncode == 0, result.stderr
    root = Path(result.stdout.strip())
    assert root == cache_dir / "sdks" / VERSION
    assert (root / "bin/x86_64-linux-clang/qnn-net-run").stat().st_mode & 0o111
    assert (root / "lib/x86_64-linux-clang/libQnnHtp.so.2").is_symlink()
