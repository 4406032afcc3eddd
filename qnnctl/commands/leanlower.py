"""`qnnctl lower` without click: its usual command line parsed here, the pipeline planned and
exec'd by qnnctl.run.lower exactly as the full command line's `lower` does.

`lower` is paid for on every run of a pipeline, and click with what it imports is about a
quarter of what qnnctl costs there before the exec. What this path parses is `lower`'s own
options (--sdk, --python, --no-install, --keep-mkldnn) up to the pipeline (SCRIPT.py, -m MODULE
or `--`); anything else (--help, --dry-run, -v or -q, an option it does not know, a pipeline
missing, a debug trace or completion asked for) is left to the full command line, which answers
it as if this path were not there. Errors are told as the full command line tells them
(qnnctl.commands.stderr), with the same exit codes. qnnctl.launch decides which path runs.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from qnnctl.commands.stderr import configure_logging, stderr_is_terminal, tell_failure
from qnnctl.run.lower import LowerOptions, exec_plan, parse_target, plan_lower
from qnnctl.sdk.cache import Cache, relative_cache_dir
from qnnctl.shell.exports import check_cache_path

# Set, they make the full command line run `lower`: a debug trace, completion.
_FULL_CLI_WHEN_SET = ("QNNCTL_DEBUG", "_QNNCTL_COMPLETE")
_VALUED = ("--sdk", "--python")
_FLAGS = ("--no-install", "--keep-mkldnn")


def lower_arguments(args: list[str]) -> tuple[LowerOptions, list[str]] | None:
    """The options of `qnnctl lower ARGS` and the pipeline's words (from SCRIPT, `-m` or `--` on,
    as the full command line hands them to parse_target); None for what this path leaves."""
    values: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or arg == "-" or not arg.startswith("-") or arg.startswith("-m"):
            break
        name, equals, value = arg.partition("=")
        if name in _VALUED and name not in values:
            if not equals:
                i += 1
                if i == len(args) or args[i] == "--":
                    return None  # the full command line says that it needs a value
                value = args[i]
            values[name] = value
        elif arg in _FLAGS:
            flags.add(arg)
        else:
            return None
        i += 1
    if i == len(args):
        return None  # nothing to run: the full command line says so
    options = LowerOptions(spec=values.get("--sdk"), python=values.get("--python"),
                           install="--no-install" not in flags, keep_mkldnn="--keep-mkldnn" in flags)
    return options, args[i:]


def lean_lower(args: list[str], environ: Mapping[str, str]) -> None:
    """Plan `qnnctl lower ARGS` and become the pipeline, or exit as the full command line would on
    an error; returns (having done nothing) when the full command line should run it instead."""
    if any(environ.get(name) for name in _FULL_CLI_WHEN_SET) or relative_cache_dir(environ) is not None:
        return
    parsed = lower_arguments(args)
    if parsed is None:
        return
    options, pipeline = parsed
    configure_logging(0, 0)
    try:
        cache = Cache.from_env(environ)
        if options.install:
            check_cache_path(str(cache.root))
        plan = plan_lower(parse_target(pipeline), options, environ, Path.cwd(), cache,
                          terminal=stderr_is_terminal())
        exec_plan(plan)
    except (Exception, KeyboardInterrupt) as exc:
        sys.exit(tell_failure(exc))

