"""The error hierarchy: every failure the CLI reports carries an exit code and a hint."""

from __future__ import annotations

# Exit codes of the command-line contract (see README, "Exit codes").
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DOWNLOAD = 3
EXIT_INTEGRITY = 4
EXIT_UNSUPPORTED_HOST = 5
EXIT_INTERRUPTED = 130  # as a shell reports a command stopped by SIGINT

INTERRUPTED = "interrupted; run the same command again to resume"


class QnnctlError(Exception):
    """A failure with a message for humans, a hint saying what to do next, and an exit code."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(QnnctlError):
    """The user asked for something malformed (a bad version, a path that cannot be exported)."""

    exit_code = EXIT_USAGE


class NotInstalledError(QnnctlError):
    """The SDK that was selected is not installed anywhere qnnctl looks."""

    def __init__(self, version: str) -> None:
        self.version = version
        super().__init__(
            f"SDK {version} is not installed",
            hint=f"run `qnnctl install {version}`",
        )


class DamagedSdkError(NotInstalledError):
    """An SDK in qnnctl's cache (its manifest is there) has lost files of its layout since."""

    def __init__(self, version: str, root: str, missing: list[str]) -> None:
        self.version = version
        self.root = root
        self.missing = missing
        QnnctlError.__init__(
            self,
            f"SDK {version} in qnnctl's cache is damaged: {root} is missing {', '.join(missing)}",
            hint=f"reinstall it: `qnnctl install --force {version}`",
        )


class InvalidSdkError(QnnctlError):
    """A folder that was named as an SDK root does not have the SDK's layout.

    `problem` replaces "is not a QNN SDK root: missing ..." when something else is wrong
    (the path is a file, or is not there); `hint` the usual one, when the caller knows better.
    """

    def __init__(self, root: str, missing: list[str], origin: str, problem: str | None = None,
                 hint: str | None = None) -> None:
        self.root = root
        self.missing = missing
        self.origin = origin
        usual = "point it at the folder that holds QNN_README.txt, lib/ and bin/, or unset it and run `qnnctl install`"
        if problem is not None:
            usual = ("an SDK root is the folder that holds QNN_README.txt, lib/ and bin/ "
                     "(an SDK archive is installed with `qnnctl install --file ARCHIVE`)")
        super().__init__(
            f"{origin} {root!s} {problem or 'is not a QNN SDK root: missing ' + ', '.join(missing)}",
            hint=usual if hint is None else hint,
        )


class DownloadError(QnnctlError):
    """The archive could not be fetched (network, HTTP status, not an archive)."""

    exit_code = EXIT_DOWNLOAD


class IntegrityError(QnnctlError):
    """A checksum mismatch, or a corrupt, truncated or unsafe archive."""

    exit_code = EXIT_INTEGRITY


class DiskSpaceError(QnnctlError):
    """Not enough free space for a download or an extraction.

    `needed` is None when the disk filled up part-way and the total is not known.
    """

    def __init__(self, where: str, needed: int | None, free: int, what: str) -> None:
        self.where = where
        self.needed = needed
        self.free = free
        if needed is None:
            message = f"ran out of space in {where} while trying to {what} ({_mib(free)} free)"
        else:
            message = f"not enough free space in {where} to {what}: need {_mib(needed)}, {_mib(free)} free"
        super().__init__(
            message,
            hint="free some space, or point QNNCTL_CACHE_DIR at a larger disk, then run the same command again",
        )


class UnsupportedHostError(QnnctlError):
    """The SDK has no host libraries for this system or machine (qnnctl.sdk.hosts lists those it has)."""

    exit_code = EXIT_UNSUPPORTED_HOST

    def __init__(self, system: str, machine: str, supported: str) -> None:
        self.system = system
        self.machine = machine
        self.supported = supported
        super().__init__(
            f"unsupported host {system}/{machine or 'unknown'}: the QNN SDK's host libraries "
            f"run on {supported} only",
            hint=f"run qnnctl on a {supported} machine or container",
        )


class NoHostLibrariesError(QnnctlError):
    """An SDK (or archive) with host libraries for other hosts than this one."""

    exit_code = EXIT_UNSUPPORTED_HOST

    def __init__(self, what: str, problem: str, hint: str) -> None:
        self.what = what
        super().__init__(f"{what} {problem}", hint=hint)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class MissingComponentError(QnnctlError):
    """The SDK is installed with some of its components (`install --components`), and not the
    ones needed: the hint is the command that adds them."""

    def __init__(self, version: str, root: str, components: tuple[str, ...], needed_for: str) -> None:
        self.version = version
        self.root = root
        self.components = components
        names = ", ".join(components)
        super().__init__(
            f"SDK {version} at {root} was installed without {names}, which {needed_for} needs",
            hint=f"add it: `qnnctl install {version} --components {','.join(components)}` "
            "(fetches only what is missing)",
        )
