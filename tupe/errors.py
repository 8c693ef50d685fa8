"""User-facing errors.

A `TupeError` is a mistake in what the user asked for (a bad file, an unknown scheme, ...): the CLI prints it as
one line and exits non-zero without a traceback. Anything else is a bug and keeps its traceback.
"""


class TupeError(Exception):
    """An error in the user's input, reported as one line by the CLI."""
