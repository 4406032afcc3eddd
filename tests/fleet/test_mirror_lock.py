"""`qnnctl mirror DIR VERSION` indexes an archive found in DIR as it indexes one it fetches: held
to the project's qnnctl.lock (and the upstream mirror's index), as `mirror --file` holds an
archive you have. The file being there already vouches for nothing."""

from __future__ import annotations

import json
import os
import pwd
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_qnnctl
from tests.httpserver import FaultServer
from tests.sdkfactory import VERSION, SdkSpec, build_archive


def _planted(tmp_path: Path, extra: str) -> tuple[Path, Path, Path]:
    """(the mirror's folder, its archive of VERSION, the archive copied there): an archive of
    VERSION that is not the one locked or indexed (it holds `extra`), put in the mirror's place."""
    (tmp_path / "another").mkdir()
    archive = build_archive(tmp_path / "another", "zip", SdkSpec(extra_files={extra: b"x\n"}))
    folder = tmp_path / "mirror"
    dest = folder / VERSION / f"v{VERSION}.zip"
    dest.parent.mkdir(parents=True)
    shutil.copyfile(archive, dest)
    return folder, dest, archive


def test_an_archive_found_in_the_mirror_is_held_to_the_lock(mirror: FaultServer, tmp_path: Path,
                                                            cache_dir: Path) -> None:
    locked = run_qnnctl("lock", VERSION)
    assert locked.returncode == 0, locked.stderr
    folder, dest, other = _planted(tmp_path, "docs/not-locked.txt")
    # As an archive you have: refused.
    added = run_qnnctl("mirror", str(tmp_path / "second"), "--file", str(other))
    assert (added.returncode, added.stdout) == (4, ""), added.stderr
    # The same bytes found in the mirror: refused as well, and not indexed.
    proc = run_qnnctl("mirror", str(folder), VERSION)
    assert (proc.returncode, proc.stdout) == (4, ""), proc.stderr
    assert f"the archive from {dest} does not match" in proc.stderr, proc.stderr
    assert "qnnctl.lock" in proc.stderr
    assert "nothing was added to the mirror" in proc.stderr
    assert not (folder / "index.json").exists()
    # The locked archive in its place is indexed, fetching nothing.
    served = len(mirror.requests_for(f"/{VERSION}/v{VERSION}.zip"))
    shutil.copyfile(tmp_path / "archives" / f"v{VERSION}.zip", dest)
    again = run_qnnctl("mirror", str(folder), VERSION)
    assert (again.returncode, again.stdout) == (0, f"{dest}\n"), again.stderr
    assert VERSION in json.loads((folder / "index.json").read_text())["versions"]
    assert len(mirror.requests_for(f"/{VERSION}/v{VERSION}.zip")) == served


def test_an_archive_added_again_replaces_a_file_in_the_mirror_that_is_not_it(tmp_path: Path,
                                                                               cache_dir: Path) -> None:
    """`mirror DIR --file A` when the index holds A already: "kept" only when the mirror's file is
    A; another file in its place (changed since it was indexed) is replaced by the copy checked."""
    (tmp_path / "a").mkdir()
    archive = build_archive(tmp_path / "a", "zip")
    folder = tmp_path / "mirror"
    first = run_qnnctl("mirror", str(folder), "--file", str(archive))
    assert first.returncode == 0, first.stderr
    dest = folder / VERSION / f"v{VERSION}.zip"
    assert dest.read_bytes() == archive.read_bytes()
    dest.write_bytes(b"PK\x05\x06" + bytes(18))  # what someone left there since
    again = run_qnnctl("mirror", str(folder), "--file", str(archive))
    assert (again.returncode, again.stdout) == (0, f"{dest}\n"), again.stderr
    assert "is in the mirror already" not in again.stderr
    assert dest.read_bytes() == archive.read_bytes()
    third = run_qnnctl("mirror", str(folder), "--file", str(archive))
    assert third.returncode == 0, third.stderr
    assert "is in the mirror already" in third.stderr


def _nobody() -> int:
    return pwd.getpwnam("nobody").pw_uid


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's takes root")
@pytest.mark.parametrize("how", ["mirror folder 0777", "mirror folder 1777", "version folder of nobody's"])
def test_a_mirror_folder_another_user_could_change_is_not_indexed(how: str, mirror: FaultServer, tmp_path: Path,
                                                                  cache_dir: Path) -> None:
    """What another user put in the mirror's folder (an archive, a folder for its version) is not
    vouched for by the index that every host installs by."""
    folder, dest, planted = _planted(tmp_path, "docs/planted.txt")
    if how == "version folder of nobody's":
        culprit, why = dest.parent, f"belongs to user nobody (uid {_nobody()})"
        os.chown(dest.parent, _nobody(), -1)
        os.chown(dest, _nobody(), -1)
    else:
        mode = 0o777 if how.endswith("0777") else 0o1777
        culprit, why = folder, f"is writable by its group and others (mode {mode:04o})"
        folder.chmod(mode)
    for args in ((VERSION,), ("--file", str(tmp_path / "archives" / f"v{VERSION}.zip"))):
        proc = run_qnnctl("mirror", str(folder), *args)
        assert (proc.returncode, proc.stdout) == (4, ""), proc.stderr
        assert f"{culprit} {why}" in proc.stderr, proc.stderr
        assert "nothing was added to the mirror" in proc.stderr
        assert not (folder / "index.json").exists()
    assert dest.read_bytes() == planted.read_bytes()
