"""User-facing errors.

A `TupeError` is a mistake in what the user asked for (a bad file, an unknown scheme, ...): the CLI prints it as
one line and exits non-zero without a traceback. Anything else is a bug and keeps its traceback.
"""


class TupeError(Exception):
    """An error in the user's input, reported as one line by the CLI."""


def one_line(err: BaseException) -> str:
    """The first line of an exception's message, whitespace collapsed: user errors are printed on one line."""
    text = str(err).strip().split("\n")[0] if str(err).strip() else type(err).__name__
    return " ".join(text.split())
