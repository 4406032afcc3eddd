"""Shells: the exports an SDK needs, their undoing, the shell's own record, and how each
shell (bash, zsh, fish, PowerShell, nu, JSON, dotenv) is detected and written.
"""
