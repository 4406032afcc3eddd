"""Which SDK a command should use: an argument, QNN_SDK_ROOT, the pin, ExecuTorch, the shell, the cache."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

from qnnctl.errors import DamagedSdkError, IntegrityError, NotInstalledError, UsageError
from qnnctl.paths import user_path
from qnnctl.records import Record
from qnnctl.sdk.cache import MANIFEST_NAME, Cache, read_manifest
from qnnctl.sdk.identity import version_of_build
from qnnctl.sdk.layout import (
    REQUIRED_LIBS,
    Sdk,
    missing_layout,
    read_build_id,
    read_sdk_version,
    sdk_from_root,
)
from qnnctl.sdk.stores import (
    LINK_ORIGIN,
    all_links,
    dangling_link_error,
    find_in_stores,
    find_linked,
    refuse_unsafe,
    store_origin,
    store_sdks,
)
from qnnctl.sdk.versions import DEFAULT_VERSION, is_full_version, parse_version, resolve_version, version_in
from qnnctl.shell.exports import apply, read_marker, unset_environment

PIN_FILE = ".qnn-version"
PIN_MOST = 64 << 10  # bytes of a pin read: a version and a line of components
# The project's lock (qnnctl.sdk.lockfile reads it), found upward as the pin is.
LOCK_FILE = "qnnctl.lock"
# The file of an installed ExecuTorch that names the SDK version it was built against.
EXECUTORCH_DOWNLOADER = ("backends", "qualcomm", "scripts", "download_qnn_sdk.py")

# How a selection was made; stable strings, shown by doctor and in --json output.
BY_ARGUMENT = "argument"
BY_ENV = "QNN_SDK_ROOT"
BY_CALLER = "caller"
BY_PIN = "pin"
BY_EXECUTORCH = "executorch"
BY_SHELL = "shell"
BY_INSTALLED = "installed"
BY_DEFAULT = "default"


class Selection(Record):
    """Which SDK a command should use, and why.

    Exactly one of `version` and `root` is set, except for a caller-managed SDK
    (`QNN_SDK_ROOT` exported but empty), where neither is.
    """

    reason: str
    detail: str
    version: str | None = None
    root: Path | None = None

    @property
    def caller_managed(self) -> bool:
        return self.reason == BY_CALLER

    @property
    def why(self) -> str:
        """Where the choice came from, in a message: `argument: given as 2.51`; the detail alone
        where it names the reason itself (`pinned in ...`, `from QNN_SDK_ROOT`), not said twice."""
        return self.detail if self.reason in (BY_PIN, BY_ENV) else f"{self.reason}: {self.detail}"

    def describe(self) -> str:
        """The choice and where it came from, for -v: `SDK 2.37.0.250724 (pinned in ...)`."""
        what = self.version or (str(self.root) if self.root else "left to the caller")
        return f"SDK {what} ({self.why})"


def caller_lib_dir(environ: Mapping[str, str]) -> Path | None:
    """The first folder on LD_LIBRARY_PATH that holds libQnnHtp.so: where a caller who
    manages the SDK itself (QNN_SDK_ROOT exported but empty) has put its libraries."""
    for entry in (environ.get("LD_LIBRARY_PATH") or "").split(":"):
        if entry and (Path(entry) / REQUIRED_LIBS[0]).is_file():
            return Path(entry)
    return None


# -- which SDK -------------------------------------------------------------------------


def user_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` as it was before any `qnnctl env`: what the user chose, not what qnnctl exported.

    A QNN_SDK_ROOT that qnnctl exported is not the user's choice, but one that it replaced is;
    every command chooses its SDK from this view, so that they all agree.
    """
    return apply(environ, unset_environment(environ))


def find_pin(start: Path) -> Path | None:
    """The nearest `.qnn-version` file at or above `start`."""
    for folder in (start, *start.parents):
        candidate = folder / PIN_FILE
        if candidate.is_file():
            return candidate
    return None


def find_lock(cwd: Path) -> Path | None:
    """The nearest `qnnctl.lock` at or above `cwd`."""
    for folder in (cwd, *cwd.parents):
        candidate = folder / LOCK_FILE
        if candidate.is_file():
            return candidate
    return None


def pin_text(path: Path) -> str:
    """What a `.qnn-version` file says; UsageError naming it when it cannot be read, or is larger
    than a pin can be: a project's pin may be a link to any file, and `qnnctl env` reads it at
    every prompt."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(PIN_MOST + 1)
        if len(raw) > PIN_MOST:
            raise UsageError(f"{path} is larger than a pin can be ({PIN_MOST} bytes)",
                             hint="fix it, or rewrite it with `qnnctl use VERSION`")
        # utf-8-sig: editors on Windows start the file with a byte-order mark.
        return raw.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the pin {path}: {exc}",
                         hint="fix it, or rewrite it with `qnnctl use VERSION`") from None


def read_pin(path: Path, pools: Iterable[tuple[str, Collection[str]]] = ()) -> str:
    """The full version a `.qnn-version` file names (a prefix resolved as `resolve_version`
    does, with `pools`); errors name the file."""
    for line in pin_text(path).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            try:
                return resolve_version(line, pools)
            except UsageError as exc:
                raise UsageError(f"{path}: {exc.message}",
                                 hint="fix it, or rewrite it with `qnnctl use VERSION`") from None
    raise UsageError(f"{path} names no version", hint="write a version such as 2.37.0.250724 into it")


# ExecuTorch 1.5 reads `QNN_VERSION="..."` from qnn_config.sh beside the downloader when that
# file exists, else falls back to `_QNN_CONFIG.get("QNN_VERSION", "<version>")`; older
# releases assign `QNN_VERSION = "<version>"` or name the archive's `qairt/<version>` folder.
# Both files are searched as bytes: the version is ASCII, and a comment in another encoding
# (or a locale that is not UTF-8) must not keep it from being read.
_ET_CONFIG_VERSION = re.compile(rb"""^\s*QNN_VERSION\s*=\s*["']?(\d+\.\d+\.\d+\.\d{6})""", re.M)
_ET_QNN_VERSION = re.compile(
    rb"""QNN_VERSION\s*(?::\s*str\s*)?=\s*"""
    rb"""(?:[\w.]+\.get\(\s*["']QNN_VERSION["']\s*,\s*|os\.getenv\(\s*["']QNN_VERSION["']\s*,\s*)?"""
    rb"""["'](\d+\.\d+\.\d+\.\d{6})["']"""
)
_ET_ANY_VERSION = re.compile(rb"""(?:qairt/|All/)(\d+\.\d+\.\d+\.\d{6})""")


def executorch_package_dir() -> Path | None:
    """Where an installed ExecuTorch lives, found without importing it."""
    try:
        spec = importlib.util.find_spec("executorch")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return Path(locations[0])
    if spec.origin:
        return Path(spec.origin).parent
    return None


def executorch_expected_version(package_dir: Path | None = None) -> str | None:
    """The SDK version an installed ExecuTorch expects, read from its downloader script."""
    package_dir = executorch_package_dir() if package_dir is None else package_dir
    if package_dir is None:
        return None
    script = package_dir.joinpath(*EXECUTORCH_DOWNLOADER)
    try:
        config = script.with_name("qnn_config.sh").read_bytes()
    except OSError:
        config = b""
    found = _ET_CONFIG_VERSION.search(config)
    if found:
        return found.group(1).decode()
    try:
        text = script.read_bytes()
    except OSError:
        return None
    match = _ET_QNN_VERSION.search(text) or _ET_ANY_VERSION.search(text)
    return match.group(1).decode() if match else None


def _looks_like_path(spec: str, cwd: Path) -> bool:
    if spec.startswith((os.sep, ".", "~")):
        return True
    # `2.37.0.250724;rm -rf /` is a mistyped version, not a relative path: a spec that starts
    # as a version does is a path only when it names something on disk.
    return os.sep in spec and (not spec[0].isdigit() or os.path.lexists(cwd / spec))


def _from(cwd: Path, path: str) -> Path:
    """`path` as a user wrote it, read from the folder `cwd` when relative."""
    return (cwd / user_path(path)).absolute()


def version_pools(cache: Cache | None, environ: Mapping[str, str],
                  mirror: bool = False) -> Iterator[tuple[str, Collection[str]]]:
    """What a version prefix (`2.51`) is looked up in before the known releases, in order:
    the SDKs installed (without a `cache`: none), then, with `mirror`, what QNNCTL_MIRROR's
    index.json lists. Read only when asked for: a full version reads none of them."""
    if cache is not None:
        yield "installed", versions_on_disk(cache, environ, usable=True)
    base = environ.get("QNNCTL_MIRROR") if mirror else None
    if base:
        from qnnctl.net.urls import redact  # lazy: qnnctl.net, which `qnnctl env` never imports

        # lazy: a mirror's index is read with requests, which `qnnctl env` never needs
        from qnnctl.sdk.mirrorindex import index_url, indexed_versions

        listed = indexed_versions(base)
        if listed:
            yield f"the mirror's {redact(index_url(base))}", listed


def resolve_spec(spec: str, cache: Cache | None, environ: Mapping[str, str], mirror: bool = False) -> str:
    """The full version `spec` names: a prefix is the newest installed match, else (with
    `mirror`) the newest that QNNCTL_MIRROR's index lists, else the newest known release."""
    return resolve_version(spec, version_pools(cache, environ, mirror))


def select_sdk(
    spec: str | None,
    environ: Mapping[str, str],
    cwd: Path,
    cache: Cache | None = None,
    from_shell: bool = True,
    mirror: bool = False,
) -> Selection:
    """Decide which SDK to use; the order is documented in the README ("Which SDK").

    `from_shell` off skips the SDK an earlier `qnnctl env` set this shell up for: `qnnctl env`
    itself chooses afresh, which is how one switches. Without a `cache`, the step "the newest
    SDK already installed" is skipped, and a version prefix is not looked up among the SDKs
    installed; with `mirror` (for the commands that may download), it is looked up in what
    QNNCTL_MIRROR's index.json lists too (`resolve_spec`). A relative path, in `spec` or
    QNN_SDK_ROOT, is read from `cwd`.
    """
    if spec is not None:
        if spec.strip() == "":
            raise UsageError("an empty string is neither an SDK version nor a path")
        if _looks_like_path(spec, cwd) or (not spec[0].isdigit() and (cwd / spec).is_dir()):
            # Absolute, so that exported paths survive a `cd` (a relative LD_LIBRARY_PATH entry
            # would be searched from wherever the process happens to be).
            root = _from(cwd, spec)
            return Selection(BY_ARGUMENT, f"given as {root}", root=root)
        version = resolve_spec(spec, cache, environ, mirror)
        return Selection(BY_ARGUMENT, f"given as {spec}", version=version)
    if from_shell:
        shell_root = shell_sdk_root(environ)
        if shell_root is not None:
            return Selection(BY_SHELL, f"this shell was set up for it by `qnnctl env` ({shell_root})",
                             root=Path(shell_root))
    env_root = user_environ(environ).get("QNN_SDK_ROOT")
    if env_root is not None:
        if env_root == "":
            return Selection(
                BY_CALLER,
                "QNN_SDK_ROOT is exported but empty: the caller manages the SDK",
            )
        return Selection(BY_ENV, "from QNN_SDK_ROOT", root=_from(cwd, env_root))
    pin = find_pin(cwd)
    if pin is not None:
        return Selection(BY_PIN, f"pinned in {pin}", version=read_pin(pin, version_pools(cache, environ, mirror)))
    expected = executorch_expected_version()
    if expected is not None:
        return Selection(BY_EXECUTORCH, "the version the installed ExecuTorch expects", version=expected)
    newest = newest_installed(cache, environ) if cache is not None else None
    if newest is not None:
        return Selection(BY_INSTALLED, "the newest SDK already installed", version=newest)
    return Selection(BY_DEFAULT, "nothing here names another (no pin, no QNN_SDK_ROOT, no ExecuTorch, none installed)",
                     version=DEFAULT_VERSION)


def shell_sdk_root(environ: Mapping[str, str]) -> str | None:
    """The SDK root `qnnctl env` exported in this shell, while QNN_SDK_ROOT still holds it.

    Once the user exports a QNN_SDK_ROOT of their own, theirs is the choice, not the record.
    """
    marker = read_marker(environ)
    if marker is None or not marker.owns_root or environ.get("QNN_SDK_ROOT") != marker.root:
        return None
    return marker.root or None


class PinConflict(Record):
    """This shell set up by `qnnctl env` for one SDK, and the project's pin naming another."""

    shell_root: Path
    shell_version: str
    pin: Path
    pinned: str
    installed: bool  # the pinned version is on disk

    def said(self) -> str:
        return (f"this shell was set up by `qnnctl env` for SDK {self.shell_version} ({self.shell_root}), but "
                f"{self.pin} pins SDK {self.pinned}")

    def switch(self) -> str:
        first = "" if self.installed else f"`qnnctl install {self.pinned}`, then "
        return f'{first}`eval "$(qnnctl env)"` switches this shell to SDK {self.pinned}'


def pin_conflict(environ: Mapping[str, str], cwd: Path, cache: Cache | None = None) -> PinConflict | None:
    """The disagreement, when this shell's SDK (step 2 of "Which SDK") hides the project's pin
    (step 4) from every command but `env`; None when they agree or either is missing."""
    root = shell_sdk_root(environ)
    pin = find_pin(cwd) if root is not None else None
    if root is None or pin is None:
        return None
    try:
        pinned = read_pin(pin, version_pools(cache, environ))
    except UsageError:
        return None
    shell_root = Path(root)
    shell_version = (read_sdk_version(shell_root) if shell_root.is_dir() else None) or version_in(shell_root.name)
    if shell_version is None or shell_version == pinned:
        return None
    installed = cache is not None and find_installed(pinned, cache, environ) is not None
    return PinConflict(shell_root, shell_version, pin, pinned, installed)


def newest_installed(cache: Cache, environ: Mapping[str, str]) -> str | None:
    """The newest version installed in qnnctl's cache, linked, in a store or in ExecuTorch's
    cache, complete ones only."""
    versions = versions_on_disk(cache, environ, usable=True)
    return max((v for v in versions if is_full_version(v)), key=parse_version, default=None)


def versions_on_disk(cache: Cache, environ: Mapping[str, str], usable: bool) -> set[str]:
    """The versions in qnnctl's cache, linked, in a store or in ExecuTorch's cache; with `usable`,
    only complete ones (no damaged cache SDK, no link whose folder has gone)."""
    # installed_versions() holds versions only: a stray folder such as `2.37.0.250724.bak` is none.
    versions = {v for v in cache.installed_versions()
                if not usable or find_installed(v, cache, environ) is not None}
    versions.update(link.version for link in all_links(cache) if not (usable and link.dangling))
    versions.update(stored.version for stored in store_sdks(environ))
    for folder in dict.fromkeys(p.parent for p in executorch_cache_dirs("x", environ)):
        if folder.is_dir():
            for entry in folder.glob("sdk-*"):
                version = entry.name.removeprefix("sdk-")
                if is_full_version(version) and not missing_layout(entry):
                    versions.add(version)
    return versions


def executorch_cache_dirs(version: str, environ: Mapping[str, str]) -> list[Path]:
    """Where ExecuTorch's own downloader would have put `version`."""
    found: list[Path] = []
    staging = environ.get("QNN_STAGING_DIR")
    if staging:
        found.append(user_path(staging) / f"sdk-{version}")
    xdg = environ.get("XDG_CACHE_HOME")
    base = user_path(xdg) if xdg else user_path(environ.get("HOME", "~")) / ".cache"
    found.append(base / "executorch" / "qnn" / f"sdk-{version}")
    return found


def find_installed(version: str, cache: Cache, environ: Mapping[str, str]) -> Sdk | None:
    """An installed copy of `version`: qnnctl's cache first, then a link (`qnnctl link`), then
    the read-only stores of QNNCTL_STORES, then ExecuTorch's cache."""
    own = cache.sdk_dir(version)
    if (own / MANIFEST_NAME).is_file() and not missing_layout(own):
        refuse_unsafe(own, f"SDK {version} of qnnctl's cache ({own})")
        return Sdk(root=own, version=version, origin="qnnctl cache")
    link = find_linked(version, cache)
    if link is not None:
        # The folder is not qnnctl's: what it holds now is checked each time it is used.
        refused = changed_link_error(link.version, link.root, link.build_id)
        if refused is not None:
            raise refused
        refuse_unsafe(link.root, f"SDK {version}, linked to {link.root},")
        return Sdk(root=link.root, version=version, origin=LINK_ORIGIN)
    stored = find_in_stores(version, environ)
    if stored is not None:
        return Sdk(root=stored.root, version=version, origin=store_origin(stored.store))
    for candidate in executorch_cache_dirs(version, environ):
        # ExecuTorch writes no completion marker, so its layout is the only evidence, and its
        # folder's name only a label: the libraries say which build it holds.
        if not missing_layout(candidate):
            refuse_unsafe(candidate, f"ExecuTorch's cache folder {candidate}")
            build = read_build_id(candidate)
            if build is not None and not is_build_of(build, version):
                raise IntegrityError(
                    f"ExecuTorch's cache folder {candidate} is named for SDK {version}, but its libraries are "
                    f"build {build} (SDK {_version_of(build)}); it is not used",
                    hint=f"remove that folder (ExecuTorch fetches the SDK again when it needs it), then "
                         f"`qnnctl install {version}`",
                )
            return Sdk(root=candidate, version=version, origin="ExecuTorch cache")
    return None


def _version_of(build: str) -> str:
    return version_of_build(build)


def is_build_of(build: str, version: str) -> bool:
    """Whether the build id `build` (`2.37.0.250724101010`) is one of SDK `version`: the whole
    version, not a prefix of it (`2.37.0.25072` is no version of that build)."""
    return _version_of(build) == version


def changed_link_error(version: str, root: Path, recorded: str | None) -> IntegrityError | None:
    """The error for a linked folder whose libraries are no longer the build `qnnctl link`
    recorded (or, when it recorded none, not a build of `version`); None when they agree."""
    build = read_build_id(root)
    if recorded is not None:
        if build == recorded:
            return None
        now = f"build {build} (SDK {_version_of(build)})" if build is not None else "a build that carries no id"
        said = f"its libraries are now {now}, not build {recorded} as when it was linked"
    else:
        if build is None or is_build_of(build, version):
            return None
        said = f"its libraries are build {build} (SDK {_version_of(build)}), not one of SDK {version}"
    return IntegrityError(
        f"SDK {version} is linked to {root}, but {said}; it is not used",
        hint=f"link the folder again as what it holds (`qnnctl link {root}`), drop the link (`qnnctl uninstall "
             f"{version}`), or install a copy into qnnctl's cache, which comes first: `qnnctl install {version} "
             "--force`",
    )


def selection_origin(selection: Selection) -> str:
    """Where an SDK named by path came from, in words (Sdk.origin)."""
    return {BY_ENV: "QNN_SDK_ROOT", BY_SHELL: "qnnctl env"}.get(selection.reason, "--sdk")


def named_sdk(root: Path, origin: str) -> Sdk:
    """The SDK at a root named by path (QNN_SDK_ROOT, --sdk, the shell `qnnctl env` set up):
    refused, as a store's SDK is, when another user could change what it loads."""
    sdk = sdk_from_root(root, origin)
    refuse_unsafe(sdk.root, f"the SDK folder {root} ({origin})")
    return sdk


def resolve_installed(selection: Selection, cache: Cache, environ: Mapping[str, str]) -> Sdk:
    """The SDK a selection names, which must already be on disk."""
    if selection.root is not None:
        if selection.reason == BY_SHELL and missing_layout(selection.root):
            raise shell_sdk_gone(selection.root, cache)
        return named_sdk(selection.root, selection_origin(selection))
    if selection.version is None:
        raise UsageError("the SDK is managed by the caller (QNN_SDK_ROOT is empty)")
    sdk = find_installed(selection.version, cache, environ)
    if sdk is None:
        own = cache.sdk_dir(selection.version)
        if (own / MANIFEST_NAME).is_file():
            # Installed by qnnctl, and files have gone since: not the same as never installed.
            damaged = DamagedSdkError(selection.version, str(own), missing_layout(own))
            damaged.hint = reinstall_hint(own, selection.version)
            raise damaged
        raise dangling_link_error(selection.version, cache) or NotInstalledError(selection.version)
    return sdk


def shell_sdk_gone(root: Path, cache: Cache) -> NotInstalledError:
    """The SDK this shell was set up for by `qnnctl env` is no longer there."""
    version = version_in(root.name)
    # `qnnctl install VERSION` puts an SDK of qnnctl's cache back where it was; one elsewhere
    # (/opt/qairt/VERSION) it installs into the cache, and the shell still names the one gone.
    again = f"`qnnctl install {version}` to put it back, or " if cache.version_at(root) else ""
    error = NotInstalledError(version or str(root))
    error.message = f"this shell was set up by `qnnctl env` for the SDK at {root}, which is gone"
    error.args = (error.message,)
    error.hint = f"{again}`eval \"$(qnnctl env)\"` to set the shell up for another SDK"
    return error


def reinstall_hint(root: Path, version: str) -> str:
    """How to reinstall the SDK at `root` from where it came.

    An SDK installed with `--file` is read again from that file, when it is still there: a
    plain `install --force` would download it from Qualcomm instead.
    """
    source = (read_manifest(root) or {}).get("source")
    if isinstance(source, str) and source.startswith("file:"):
        archive = Path(unquote(urlparse(source).path))
        if archive.is_file():
            return f"reinstall it: `qnnctl install --force --file {shlex.quote(str(archive))}`"
        return (f"reinstall it from its archive: `qnnctl install --force --file ARCHIVE` (it was "
                f"installed from {archive}, which is gone)")
    return f"reinstall it: `qnnctl install --force {version}`"
