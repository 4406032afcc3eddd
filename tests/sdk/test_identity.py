"""The build id in an SDK's libraries (qnnctl.sdk.identity), and the known ExecuTorch pairings."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from qnnctl.sdk.compat import known_pairing
from qnnctl.sdk.identity import build_id, sdk_build_ids, version_of_build
from tests.sdkfactory import compile_shared

BUILD = "2.51.0.260929181845"


def library_with(tmp_path: Path, text: str, name: str = "libQnnHtp.so") -> Path:
    source = f'__attribute__((used)) static const char qnn_build[] = "{text}";\n'
    return compile_shared(tmp_path / name, source, providers=False)


def test_the_build_id_comes_from_the_read_only_data(tmp_path: Path) -> None:
    lib = library_with(tmp_path, f"hexnn_ver_v{BUILD}.")
    assert build_id(lib) == BUILD
    assert version_of_build(BUILD) == "2.51.0.260929"


def test_a_longer_dotted_number_is_not_a_build_id(tmp_path: Path) -> None:
    assert build_id(library_with(tmp_path, f"1.v{BUILD}")) is None
    assert build_id(library_with(tmp_path / "b", f"v{BUILD}7")) is None


def test_only_elf_files_carry_one(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text(f"release v{BUILD}\n")
    assert build_id(text) is None
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    assert build_id(empty) is None
    assert build_id(tmp_path / "absent.so") is None


@pytest.mark.parametrize("field", ["shoff", "shnum", "shstrndx"])
def test_a_damaged_section_table_is_searched_whole_without_failing(tmp_path: Path, field: str) -> None:
    lib = library_with(tmp_path, f"v{BUILD}")
    data = bytearray(lib.read_bytes())
    at, fmt, value = {"shoff": (0x28, "<Q", 1 << 40), "shnum": (0x3C, "<H", 0xFFFF),
                      "shstrndx": (0x3E, "<H", 0xFFF0)}[field]
    struct.pack_into(fmt, data, at, value)
    lib.write_bytes(bytes(data))
    assert build_id(lib) == BUILD


def test_libraries_of_two_builds_are_told_apart(tmp_path: Path) -> None:
    library_with(tmp_path, f"v{BUILD}", "libQnnHtp.so")
    library_with(tmp_path, "v2.47.0.260601114230", "libQnnSystem.so")
    assert sdk_build_ids(tmp_path) == {"libQnnHtp.so": BUILD, "libQnnSystem.so": "2.47.0.260601114230"}


def test_known_pairings() -> None:
    bad = known_pairing("1.5.1", "2.51.0.260929")
    assert bad is not None
    assert not bad.works
    assert "14001" in bad.consequence
    assert known_pairing("1.5.1+cpu", "2.47.0.260601") == bad  # a local tag is the same release
    good = known_pairing("1.5.0", "2.37.0.250724")
    assert good is not None
    assert good.works
    assert known_pairing("1.5.1", "2.40.0.251030") is None  # nothing known: no verdict
    assert known_pairing("1.4.0", "2.51.0.260929") is None


def test_doctor_fails_an_sdk_whose_libraries_are_of_two_builds(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from qnnctl.doctor.diagnose import diagnose
    from qnnctl.doctor.report import FAIL
    from tests.sdkfactory import VERSION, SdkSpec, build_sdk_tree

    monkeypatch.setenv("QNNCTL_FORCE_CPU_VENDOR", "GenuineIntel")
    root = build_sdk_tree(tmp_path / "qairt" / VERSION, SdkSpec(build_id=f"v{VERSION}101010"))
    library_with(root / "lib" / "x86_64-linux-clang", f"v{BUILD}", "libQnnSystem.so")
    results = {r.id: r for r in diagnose(str(root), dict(os.environ), Path.cwd(), offline=True)}
    version = results["sdk.version"]
    assert version.status == FAIL
    assert version.detail.startswith(f"its libraries are of more than one build: libQnnHtp.so is {VERSION}101010, "
                                     f"libQnnSystem.so is {BUILD}")
