"""The commands: each module defines one command, or a few related ones, parsing and calling one
core function; qnnctl.cli loads a command's module only when that command runs."""
