"""The one base class of errors caused by the user's input (stdlib only, imported everywhere).

The CLI prints an :class:`InputError` as one line and exits with status 2; anything else is a
bug or an outside failure and keeps its traceback. Catching the base class lets the CLI stay
free of the heavy modules (pandas, Ray, MLflow) that define particular errors.
"""


class InputError(ValueError):
    """Bad input (a config, a file, a URI, a directory); the message names what is wrong."""
