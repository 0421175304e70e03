"""The root of every error recpipe raises for bad input or a bad state.

Each package's errors derive from RecpipeError (and from the builtin they used to be, so callers
catching ValueError keep working); the CLI prints any of them as one line naming the file, row or key.
"""

__all__ = ["RecpipeError"]


class RecpipeError(Exception):
    """Bad input, a bad config or an unusable artifact; the message names what to fix."""
