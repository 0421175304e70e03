"""The root of every error recpipe raises for bad input or a bad state.

Each package's errors derive from RecpipeError and from the builtin that fits them (ValueError for bad
input, RuntimeError for a bad state), so callers catching that builtin catch them too; the CLI prints any
of them as one line naming the file, row or key.
"""

__all__ = ["RecpipeError"]


class RecpipeError(Exception):
    """Bad input, a bad config or an unusable artifact; the message names what to fix."""


class ConfigError(RecpipeError, ValueError):
    """A config, option or project file is invalid; the message names the key as a dotted path."""
