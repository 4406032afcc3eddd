"""`qnnctl doctor`: every reason the SDK will not load, each with the command that fixes it.

Each check is a small function of a `Context` that returns an `Outcome`. The checks run one
after another and independently: one that raises becomes a `fail` (or a `skip`) and the rest
still run. The checks live by what they look at (host, sdk, network, fleet, device); this
module holds their order, and runs them.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

from qnnctl.doctor.context import Check, Context
from qnnctl.doctor.device import DEVICE_CHECKS, MODEL_CHECK
from qnnctl.doctor.fleet import check_lock, check_stores
from qnnctl.doctor.host import (
    check_cpu,
    check_environment,
    check_glibc,
    check_glibcxx,
    check_host,
    check_libraries,
    check_load,
)
from qnnctl.doctor.network import check_network
from qnnctl.doctor.report import FAIL, SKIP, STATUSES, Outcome, Result, Skip
from qnnctl.doctor.sdk import (
    check_cache,
    check_executorch,
    check_layout,
    check_manifest,
    check_onnxruntime,
    check_selection,
    check_verify,
    check_version,
)
from qnnctl.errors import QnnctlError, UsageError
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.select import select_sdk

log = logging.getLogger("qnnctl.doctor.diagnose")

CHECKS: tuple[tuple[str, Check], ...] = (
    ("host", check_host),
    ("sdk.selection", check_selection),
    ("sdk.layout", check_layout),
    ("sdk.version", check_version),
    ("sdk.manifest", check_manifest),
    ("sdk.verify", check_verify),
    ("libraries", check_libraries),
    ("glibc", check_glibc),
    ("libstdc++", check_glibcxx),
    ("load", check_load),
    ("environment", check_environment),
    ("executorch", check_executorch),
    ("onnxruntime", check_onnxruntime),
    ("cpu", check_cpu),
    ("cache", check_cache),
    ("network", check_network),
    ("lock", check_lock),
    ("stores", check_stores),
)


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def run_check(check_id: str, check: Check, ctx: Context) -> Result:
    """Run one check; whatever it raises becomes its result, never the end of the report."""
    try:
        outcome = check(ctx)
    except Skip as skip:
        outcome = Outcome(SKIP, skip.detail, skip.hint)
    except QnnctlError as exc:
        outcome = Outcome(FAIL, exc.message, exc.hint)
    except Exception as exc:
        log.debug("check %s raised:\n%s", check_id, traceback.format_exc().rstrip())
        outcome = Outcome(
            FAIL,
            f"the check itself failed: {type(exc).__name__}: {exc}",
            "this is a bug in qnnctl; `qnnctl -vv doctor` shows the traceback",
        )
    if outcome.status not in STATUSES:
        outcome = Outcome(FAIL, f"the check returned an unknown status {outcome.status!r}")
    hint = _one_line(outcome.hint) if outcome.hint else None
    return Result(check_id, outcome.status, _one_line(outcome.detail), hint)


def run_checks(ctx: Context, checks: Sequence[tuple[str, Check]] = CHECKS) -> list[Result]:
    results = []
    for check_id, check in checks:
        log.debug("checking %s", check_id)
        results.append(run_check(check_id, check, ctx))
    return results


def diagnose(
    spec: str | None,
    environ: Mapping[str, str],
    cwd: Path,
    offline: bool = False,
    verify: bool = False,
    device: str | None = None,
    models: Sequence[Path] = (),
    python: str | None = None,
) -> list[Result]:
    """Every check, for the SDK `spec` names (or the one qnnctl would choose); with `device`
    (a serial, or "" for the only device adb sees), the device's checks after the host's, and
    with `models`, whether the device's runtime loads them."""
    if spec is not None:
        # A malformed argument is a usage error (exit 2), not a failed check.
        select_sdk(spec, environ, cwd, Cache.from_env(environ))
    if models and device is None:
        raise UsageError("--model is checked against a device's runtime: give --device too",
                         hint="`qnnctl inspect --sdk VERSION MODEL` checks it against an SDK on this host")
    checks = CHECKS
    if device is not None:
        checks = CHECKS + DEVICE_CHECKS + ((MODEL_CHECK,) if models else ())
    ctx = Context(spec=spec, environ=environ, cwd=cwd, offline=offline, verify=verify, device=device,
                  models=tuple(models), python=python)
    return run_checks(ctx, checks)
