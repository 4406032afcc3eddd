"""Qualcomm SoCs, the HTP (Hexagon NPU) generation each has, and what QAIRT serves each one.

Knowledge of the outside world, kept as data: each row names its source and when it was read.
A new SoC is one more `Soc` row; a new HTP generation one more `Arch` row.

The SoC names are those QNN and ExecuTorch use (`SM8750`), which Android reports as
`ro.soc.model` (Android 12 and later), sometimes with a suffix (`SM8750P`). The kernel's
`/sys/devices/soc0/soc_id` is a number of its own, not this name, and is not read.
"""

from __future__ import annotations

import re

from qnnctl.records import Record

# Where the SoC rows come from.
QC_SCHEMA = ("ExecuTorch backends/qualcomm/serialization/qc_schema.py, _soc_info_table "
             "(pytorch/executorch main)")
QC_SCHEMA_READ = "2026-12-01"


class Arch(Record):
    """One HTP generation: `V79` is served by `lib/hexagon-v79/unsigned/libQnnHtpV79Skel.so`
    and `lib/aarch64-android/libQnnHtpV79Stub.so`."""

    number: int
    # The first QAIRT (major, minor) whose SDK ships this generation's skel; None: every
    # release qnnctl knows of (2.23 onward) does.
    since: tuple[int, int] | None
    evidence: str
    seen: str

    @property
    def name(self) -> str:
        return f"V{self.number}"


class Soc(Record):
    model: str  # as QNN names it: SM8750
    arch: int  # the HTP generation's number: 79
    source: str
    seen: str


ARCHES: tuple[Arch, ...] = (
    Arch(68, None, "in every QAIRT release qnnctl knows of (lib/hexagon-v68)", "2026-12-01"),
    Arch(69, None, "in every QAIRT release qnnctl knows of (lib/hexagon-v69)", "2026-12-01"),
    Arch(73, None, "in every QAIRT release qnnctl knows of (lib/hexagon-v73)", "2026-12-01"),
    Arch(75, None, "in every QAIRT release qnnctl knows of (lib/hexagon-v75)", "2026-12-01"),
    Arch(79, (2, 30), "QAIRT's V79 skel (lib/hexagon-v79) first ships in 2.30", "2026-12-01"),
    Arch(81, (2, 42), "QAIRT's V81 skel (lib/hexagon-v81) first ships in 2.42; the 2.51 build in "
         "onnxruntime-qnn 2.7.0 (aarch64) carries it", "2026-12-01"),
)

SOCS: tuple[Soc, ...] = (
    Soc("SM8350", 68, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SA8295", 68, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("QCM6490", 68, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SM8450", 69, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SM8475", 69, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SXR2230P", 69, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SM8550", 73, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SA8255", 73, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SSG2115P", 73, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SSG2125P", 73, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SXR1230P", 73, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("QCS9100", 73, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SM8650", 75, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SM8750", 79, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SXR2330P", 79, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SM8850", 81, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SM8845", 81, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SA8797", 81, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SAR2230P", 81, QC_SCHEMA, QC_SCHEMA_READ),
    Soc("SW6100", 81, QC_SCHEMA, QC_SCHEMA_READ),
)

_BY_MODEL = {soc.model: soc for soc in SOCS}
_BY_NUMBER = {arch.number: arch for arch in ARCHES}
# A suffix after the name QNN knows: `SM8750P`, `SM8650-AB`, `sm8550 `.
_SUFFIX = re.compile(r"^([A-Z]+[0-9]+)[A-Z]{1,3}$")


def arch(number: int) -> Arch:
    return _BY_NUMBER[number]


def find_soc(reported: str) -> Soc | None:
    """The table's SoC for what a device reports (or a user types), suffix and case aside."""
    name = reported.strip().upper()
    if name in _BY_MODEL:
        return _BY_MODEL[name]
    name = re.split(r"[^A-Z0-9]", name, maxsplit=1)[0]
    if name in _BY_MODEL:
        return _BY_MODEL[name]
    # `SM8750P` is SM8750; `SXR2230P` is itself a row, found above.
    match = _SUFFIX.match(name)
    if match and match.group(1) in _BY_MODEL:
        return _BY_MODEL[match.group(1)]
    return None


def known_socs() -> str:
    """Every SoC, by HTP generation: `V68: SM8350, SA8295, QCM6490; V69: ...`."""
    return "; ".join(
        f"{a.name}: " + ", ".join(s.model for s in SOCS if s.arch == a.number) for a in ARCHES
    )


def serves(arch_number: int, qairt: tuple[int, int]) -> bool:
    """Whether QAIRT (major, minor) ships this generation's skel."""
    since = arch(arch_number).since
    return since is None or qairt >= since
