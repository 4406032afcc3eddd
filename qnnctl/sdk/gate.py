"""The one gate: what an SDK on its way in must match, checked in one place.

Whatever the way in (a whole download, Range requests, a server that ignores them, an archive
on disk, components added to an SDK installed with fewer, an SDK found on disk), what arrives
is described by what was observed of it (`Observed`: the whole archive's sha256 when all of it
was read, the digests of the components written, the central directory's sha256) and compared
here with everything expected of it (`Expected`: `--sha256`, the project's lock, the mirror's
index, the archive the components already installed came from).

Who vouches for an SDK (the project's lock, the mirror's index) is handed down to the install
pipeline by its callers as `Vouchers` (built by qnnctl.sdk.vouchers): the pipeline asks them
what it needs through `Lock` and `Index`, and never reads a lock or an index itself.

CRC-32s detect accidents, not adversaries: what a lock or an index vouches for is compared by
sha256, of the whole archive or of each component's members (see qnnctl.sdk.components). An
expectation that this way in cannot check is a refusal (exit 4, nothing installed) that says
what would let it check; never "installed, unchecked".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from qnnctl.errors import IntegrityError
from qnnctl.records import TYPE_CHECKING, Record
from qnnctl.sdk.components import ALL
from qnnctl.sdk.hosts import HOSTS, this_host

if TYPE_CHECKING:
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.layout import Sdk

_HEX = frozenset("0123456789abcdef")


def is_sha256(value: object) -> bool:
    """A sha256 digest as qnnctl writes them: 64 lowercase hex digits."""
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


class Expected(Record):
    """What one source expects of an SDK's archive."""

    source: str  # who expects it, as a message names it: a lock's path, the mirror's index, --sha256
    name: str  # the same, short: "the lock", "the index", "--sha256"
    says: str  # how it says it: "pins", "says", "expects"
    hint: str  # what to do when it does not match
    sha256: str | None = None  # of the whole archive
    size: int | None = None
    components: Mapping[str, str] | None = None  # component -> digest of its members
    central_directory_sha256: str | None = None
    # Only "the archive the components installed came from" is vouched for by its central
    # directory alone: that check is against a changed archive, not against an adversary, who
    # could have served the first components as well. A lock or an index never is.
    by_directory: bool = False


class Observed(Record):
    """What was seen of the bytes that arrived."""

    shown: str  # where they came from (a URL, redacted, or a path)
    sha256: str | None = None  # of the whole archive, when all of it was read
    size: int | None = None
    components: Mapping[str, str] | None = None  # digests of the components written, as computed
    central_directory_sha256: str | None = None


class Lock(Protocol):
    """The project's qnnctl.lock, as the install pipeline asks it (qnnctl.sdk.lockfile.ProjectLock)."""

    def expected(self, version: str) -> Expected | None:
        """What an archive of `version` must match; None when the lock speaks of another version
        (under --locked that is a refusal instead)."""
        ...

    def components(self, version: str) -> tuple[str, ...] | None:
        """The components the lock names for `version`, if it names any."""
        ...

    def check_found(self, sdk: Sdk, cache: Cache) -> None:
        """An SDK found on disk: IntegrityError (exit 4) unless it matches, or, under --locked,
        when it cannot be checked."""
        ...


class Index(Protocol):
    """A mirror's index.json, as the install pipeline asks it (qnnctl.sdk.mirrorindex.MirrorIndex);
    read once, when first asked."""

    @property
    def base(self) -> str:
        """The mirror's base URL: where the archives it vouches for are fetched from."""
        ...

    @property
    def where(self) -> str:
        """Its URL, redacted, as messages name it."""
        ...

    def versions(self) -> Collection[str] | None:
        """The versions it lists; None when the mirror has no index, or it cannot be read."""
        ...

    def expected(self, version: str) -> Expected | None:
        """What the mirror's archive of `version` must match; None when the index has nothing to say."""
        ...


class Vouchers(Record):
    """Who, besides --sha256, says what an SDK must be. None: nobody (no lock is consulted while
    `qnnctl lock` writes one; no mirror is set)."""

    lock: Lock | None = None
    mirror: Index | None = None


def given_sha256(sha256: str | None) -> Expected | None:
    """What `--sha256` expects, if it was given."""
    if sha256 is None:
        return None
    return Expected("--sha256", "--sha256", "expects", "check the --sha256 value, or the archive's source",
                    sha256=sha256)


def agree(expected: Sequence[Expected]) -> None:
    """Before anything is fetched: the sources that pin the archive's sha256 pin the same one."""
    named = [e for e in expected if e.sha256 is not None]
    for other in named[1:]:
        if other.sha256 != named[0].sha256:
            raise IntegrityError(
                f"{named[0].source} expects sha256 {named[0].sha256}, but {other.source} expects {other.sha256}; "
                "nothing was fetched",
                hint="find out which is right; `qnnctl lock VERSION` writes the lock again, "
                "`qnnctl mirror DIR VERSION` the mirror's index",
            )


# No SDK archive is larger (QAIRT's are 1-2 GB): a download that nothing pins stops there, not
# when a server that never stops has filled the disk.
MOST_ARCHIVE = 16 << 30


def size_limit(expected: Sequence[Expected]) -> tuple[int, str]:
    """(the fewest bytes an archive is pinned to, who pins it, as a message names them): a body
    longer than that passes no gate, and a download can stop there. MOST_ARCHIVE when no size is
    pinned."""
    pinned = [e for e in expected if e.sha256 is not None and e.size is not None]
    if not pinned:
        return MOST_ARCHIVE, "qnnctl takes as the most any SDK archive is"
    least = min(pinned, key=lambda e: e.size or 0)
    return least.size or 0, f"{least.source} {least.says}"


def why_whole(expected: Sequence[Expected], components: Collection[str]) -> str | None:
    """Why an install of `components` by parts could not be checked against `expected`, so
    that the whole archive must be fetched (and checked whole); None when it can be."""
    for e in expected:
        if e.by_directory:
            continue
        if e.sha256 is not None and e.components is None:
            return f"{e.source} {e.says} the whole archive's sha256 and no component's"
        missing = [c for c in components if e.components is not None and c not in e.components]
        if missing:
            return f"{e.source} {e.says} no digest of {', '.join(missing)}"
    return None


def why_all(expected: Sequence[Expected], components: Collection[str]) -> str | None:
    """Why the components of `expected` cannot check an install of `components` on this host, so
    that the whole SDK must be installed (and checked whole); None when they can.

    Digests partition an SDK as on x86_64 on every host (qnnctl.sdk.members), so that a lock or
    an index says the same everywhere; another host's `host` holds other folders, and a tree of
    some components there matches no digest.
    """
    here = this_host()
    if here == HOSTS[0] or ALL in components:
        return None
    for e in expected:
        if e.components is not None:
            return (f"{e.source} {e.says} components' digests as on {HOSTS[0].name}, which do not cover "
                    f"this {here.name} host's components")
    return None


def check(expected: Sequence[Expected], observed: Observed) -> None:
    """IntegrityError (exit 4) unless what was observed matches every expectation."""
    for e in expected:
        _check_one(e, observed)


def _check_one(e: Expected, o: Observed) -> None:
    if e.sha256 is not None and o.sha256 is not None:
        _same(e, o, "its sha256", e.sha256, o.sha256)
        # The archive is the one pinned; its size, its components and its central directory must
        # then be the ones pinned too, or the source contradicts itself (an edited lock) and vouches
        # for nothing.
        if e.size is not None and o.size is not None and e.size != o.size:
            raise _contradicts(e, o, "its size", str(o.size), str(e.size))
        if e.components is not None and o.components is not None:
            for name, digest in sorted(o.components.items()):
                wanted = e.components.get(name)
                if wanted != digest:
                    raise _contradicts(e, o, f"the digest of its component {name}", digest, wanted)
        directory = o.central_directory_sha256
        if e.central_directory_sha256 is not None and directory is not None and e.central_directory_sha256 != directory:
            raise _contradicts(e, o, "its central directory's sha256", directory, e.central_directory_sha256)
        return
    checked = False
    if e.components is not None and o.components is not None:
        for name, digest in sorted(o.components.items()):
            wanted = e.components.get(name)
            if wanted is None:
                raise _cannot(e, o, f"it has no digest of the component {name}")
            _same(e, o, f"the digest of its component {name}", wanted, digest)
        checked = bool(o.components)
    if e.central_directory_sha256 is not None and o.central_directory_sha256 is not None:
        _same(e, o, "its central directory's sha256", e.central_directory_sha256, o.central_directory_sha256)
        checked = checked or e.by_directory
    if not checked:
        raise _cannot(e, o, _what_is_missing(e, o))


def _contradicts(e: Expected, o: Observed, what: str, observed: str, wanted: str | None) -> IntegrityError:
    return IntegrityError(
        f"{e.source} contradicts itself: the archive from {o.shown} has the sha256 {e.name} {e.says}, but {what} "
        f"is {observed}, and {e.name} {e.says} {wanted or 'none'}; nothing was installed",
        hint=e.hint,
    )


def _what_is_missing(e: Expected, o: Observed) -> str:
    if e.sha256 is not None and e.components is None:
        return f"it {e.says} only the whole archive's sha256, and only part of the archive was read"
    if e.components is not None and o.components is None:
        return "it pins components' digests, and none were computed on this way in"
    return "nothing it pins was observed on this way in"


def _same(e: Expected, o: Observed, what: str, wanted: str, got: str) -> None:
    if wanted != got:
        raise IntegrityError(
            f"the archive from {o.shown} does not match {e.source}: {what} is {got}, {e.name} {e.says} {wanted}; "
            "nothing was installed",
            hint=e.hint,
        )


def _cannot(e: Expected, o: Observed, why: str) -> IntegrityError:
    return IntegrityError(
        f"the archive from {o.shown} cannot be checked against {e.source}: {why}; nothing was installed",
        hint=e.hint,
    )
