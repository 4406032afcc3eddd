"""Doctor's check of the network: whether the download host (or QNNCTL_MIRROR) answers, and
through which proxy and CA bundle, as an install would reach it.
"""

from __future__ import annotations

import ssl

from qnnctl.doctor.context import Context, Target
from qnnctl.doctor.report import Outcome, Skip, fail, ok, warn
from qnnctl.errors import QnnctlError
from qnnctl.net.download import make_session
from qnnctl.net.failures import ProxyFailed, RequestError, UnusableBundle
from qnnctl.net.retry import causes, describe, refused
from qnnctl.net.urls import check_url, redact
from qnnctl.sdk.select import select_sdk
from qnnctl.sdk.versions import DEFAULT_BASE_URL, DEFAULT_VERSION, archive_urls, is_full_version

NETWORK_TIMEOUT = 5.0
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def check_network(ctx: Context) -> Outcome:
    if ctx.offline:
        raise Skip("--offline")
    mirror = ctx.environ.get("QNNCTL_MIRROR") or None
    if mirror is not None:
        try:
            # As install would refuse it, before a request: the parser's words would quote a
            # misplaced password.
            check_url(mirror, "QNNCTL_MIRROR", allow_file=False)
        except QnnctlError as exc:
            return fail(exc.message, exc.hint)
    try:
        target: Target | None = ctx.target()
    except Exception:
        target = None
    # The archive of the SDK selected: the one an SDK named by its folder (this shell's, a
    # QNN_SDK_ROOT) is, else the one named but not installed; qnnctl's default only when
    # nothing was selected at all.
    version: str | None = None
    if target is not None:
        version = target.selection.version or (target.sdk.version if target.sdk is not None else None)
    else:
        try:
            version = select_sdk(ctx.spec, ctx.environ, ctx.cwd, ctx.cache()).version
        except Exception:
            version = None
    if version is None and ctx.spec is None:
        version = DEFAULT_VERSION
    url = archive_urls(version, mirror)[0] if version and is_full_version(version) else (mirror or DEFAULT_BASE_URL)
    shown = redact(url)  # people paste doctor's report into bug reports
    installed = target is not None and (target.sdk is not None or target.selection.caller_managed)

    session = make_session()
    # What the session will do for this URL, from the same environment variables.
    proxy = session.settings.proxy_url(url)
    proxy_vars = [name for name in PROXY_VARS if ctx.environ.get(name)]
    no_proxy = ctx.environ.get("NO_PROXY") or ctx.environ.get("no_proxy")
    if proxy:
        via = f"through proxy {redact(proxy)} (from {', '.join(proxy_vars) or 'the system settings'})"
    elif proxy_vars and no_proxy:
        via = f"directly: NO_PROXY={no_proxy} covers it ({', '.join(proxy_vars)} set)"
    elif proxy_vars:
        via = f"directly ({', '.join(proxy_vars)} set, none for {url.split(':', 1)[0]})"
    else:
        via = "directly (no proxy variable set)"
    bundle = session.settings.ca_bundle
    if bundle is not None and url.startswith("https:"):
        via += f", CA bundle {bundle}"
    source = "the mirror (QNNCTL_MIRROR)" if mirror else "the download host"
    try:
        with session, session.head(url, (NETWORK_TIMEOUT, NETWORK_TIMEOUT)) as response:
            status = response.status
    except RequestError as exc:
        if isinstance(exc, UnusableBundle) or any(isinstance(link, ssl.SSLError) for link in causes(exc)):
            outcome = fail
            detail = f"TLS to {source} {shown} failed {via}: {describe(exc)}"
            hint = "set REQUESTS_CA_BUNDLE to your organisation's CA bundle"
        elif isinstance(exc, ProxyFailed):
            outcome = fail
            detail = f"the proxy refused the request for {shown}: {describe(exc)}"
            hint = "check HTTPS_PROXY / HTTP_PROXY (and NO_PROXY)"
        else:
            outcome = fail
            detail = f"cannot reach {source} {shown} {via}: {describe(exc)}"
            if mirror and refused(exc):
                # Something answered for the host, and refused: a mistyped port, most often (as install says).
                hint = "check the host and port of QNNCTL_MIRROR"
            elif mirror:
                hint = "check the network, HTTPS_PROXY and NO_PROXY, and the host of QNNCTL_MIRROR"
            else:
                hint = "check the network, HTTPS_PROXY and NO_PROXY; set QNNCTL_MIRROR for a mirror"
    else:
        detail = f"{source} answered HTTP {status} for {shown}, {via}"
        if status == 404:
            return warn(detail, hint="the archive is not there; check the version or QNNCTL_MIRROR")
        if status in (401, 403, 407) or status >= 500:
            return warn(detail, hint="check proxy credentials and access to the download host")
        return ok(detail)
    if installed:
        # The SDK is already on disk: nothing needs the network until the next install.
        return warn(detail + " (the SDK is already installed)", hint + "; `--offline` skips this check")
    return outcome(detail, hint)
