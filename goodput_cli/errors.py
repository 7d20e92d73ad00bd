"""Errors every command may raise to end with a one-line reason and exit status 2."""


class UsageError(Exception):
    """Bad input from the user: the message says what was wrong and what to do instead."""
