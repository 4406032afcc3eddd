"""Known ExecuTorch and QAIRT pairings: which work and which fail, each with its evidence.

Knowledge of the outside world, kept as data: a row says which ExecuTorch releases and which
QAIRT minor versions it covers, what happens, where that was seen and when. A newer finding is
one more row; the first row that matches decides.
"""

from __future__ import annotations

from qnnctl.records import Record
from qnnctl.sdk.versions import parse_version


class Pairing(Record):
    executorch: str  # a release, or a prefix of releases ("1.5" is 1.5.0, 1.5.1, ...)
    qairt_from: tuple[int, int]  # (major, minor), inclusive
    qairt_to: tuple[int, int] | None  # inclusive; None: every later release too
    works: bool
    consequence: str
    evidence: str
    seen: str  # when the evidence was taken


KNOWN_PAIRINGS: tuple[Pairing, ...] = (
    Pairing(
        "1.5.1", (2, 47), None, False,
        "it loads the libraries, then stops at QNN device creation with error 14001 (`Failed to "
        "create device_handle for Backend ID 6, error=14001`): the HTP device config struct it was "
        "built against changed layout",
        "ExecuTorch 1.5.1 from PyPI lowering a model on QAIRT 2.47.0.260601114230 and "
        "2.51.0.260929181845 host libraries (tests/test_genuine.py)",
        "2026-12-01",
    ),
    Pairing(
        "1.5", (2, 37), (2, 37), True,
        "the QAIRT release it was built for",
        "ExecuTorch 1.5's backends/qualcomm/scripts (qnn_config.sh, download_qnn_sdk.py) pin "
        "2.37.0.250724",
        "2026-12-01",
    ),
)


def _release_matches(release: str, pattern: str) -> bool:
    # A local tag (`1.5.1+cpu`) names the same release.
    public = release.split("+", 1)[0]
    return public.split(".")[: len(pattern.split("."))] == pattern.split(".")


def known_pairing(executorch: str, qairt: str) -> Pairing | None:
    """The first known pairing that covers ExecuTorch `executorch` with QAIRT `qairt`."""
    minor = parse_version(qairt).major_minor
    for row in KNOWN_PAIRINGS:
        if not _release_matches(executorch, row.executorch):
            continue
        if minor >= row.qairt_from and (row.qairt_to is None or minor <= row.qairt_to):
            return row
    return None


class EpRequirement(Record):
    """What a release of ONNX Runtime's QNN execution provider (`onnxruntime-qnn`) needs of the
    SDK whose libQnnHtp.so it is given as `backend_path`: the QNN core API version it checks."""

    release: str  # a release, or a prefix of releases
    core_api: tuple[int, int]  # the lowest QNN core API (major, minor) it accepts
    qairt: str  # the QAIRT release that first offers that API
    consequence: str
    evidence: str
    seen: str


EP_REQUIREMENTS: tuple[EpRequirement, ...] = (
    EpRequirement(
        "2.7", (2, 40), "2.51",
        "it stops at `Unable to find a valid interface` unless the provider option "
        "`skip_qnn_version_check` is \"1\" (with it, it compiles and runs on 2.47's libraries)",
        "onnxruntime-qnn 2.7.0 with onnxruntime 1.32.0 compiling a model with QAIRT 2.51.0.260929181845 "
        "(core API 2.40.0) and 2.47.0.260601114230 (core API 2.36.0) host libraries (tests/test_genuine.py)",
        "2026-12-04",
    ),
)


def ep_requirement(release: str) -> EpRequirement | None:
    """The first known requirement of onnxruntime-qnn `release`."""
    return next((row for row in EP_REQUIREMENTS if _release_matches(release, row.release)), None)


class Carried(Record):
    """The QAIRT build a release of onnxruntime-qnn carries in its wheel, and the core
    onnxruntime it declares it needs."""

    release: str  # a release, or a prefix of releases
    qairt: str
    onnxruntime: tuple[int, int, int]  # the lowest core onnxruntime its METADATA accepts
    evidence: str
    seen: str


_ORT_QNN_NOTES = "the onnxruntime-qnn project's release notes"
_ORT_QNN_META = "the wheel's METADATA (Requires-Dist: onnxruntime>=1.24.2), read from 2.3.0's and 2.7.0's"
ORT_QNN_CARRIES: tuple[Carried, ...] = tuple(
    Carried(release, qairt, (1, 24, 2), f"{_ORT_QNN_NOTES}; {_ORT_QNN_META}", "2026-12-05")
    for release, qairt in (("2.0", "2.42.0"), ("2.1", "2.45.40"), ("2.2", "2.46.0"), ("2.3", "2.47.0"),
                           ("2.4", "2.48.40"), ("2.5", "2.49.40"), ("2.6", "2.50.40"), ("2.7", "2.51.0"),
                           ("2.8", "2.52.0"))
)


def ort_qnn_carries(release: str) -> Carried | None:
    """What onnxruntime-qnn `release` carries and needs, if known."""
    return next((row for row in ORT_QNN_CARRIES if _release_matches(release, row.release)), None)


class PassNeed(Record):
    """An ExecuTorch Qualcomm pass that needs a newer QAIRT than ExecuTorch's pin, and falls back
    without a word on an older one."""

    what: str
    qairt: tuple[int, int]  # the first (major, minor) it works with
    evidence: str
    seen: str


_ET_PASSES = "ExecuTorch backends/qualcomm (pytorch/executorch main), whose 1.5 releases pin QAIRT 2.37.0.250724"
EXECUTORCH_PASS_NEEDS: tuple[PassNeed, ...] = (
    PassNeed("Hadamard recomposition", (2, 47), _ET_PASSES, "2026-12-05"),
    PassNeed("an embedding op builder", (2, 48), _ET_PASSES, "2026-12-05"),
)


def passes_that_fall_back(qairt: str) -> tuple[PassNeed, ...]:
    """The ExecuTorch passes that fall back silently on QAIRT `qairt`."""
    minor = parse_version(qairt).major_minor
    return tuple(row for row in EXECUTORCH_PASS_NEEDS if minor < row.qairt)
