"""One error hierarchy for tilework.

Every error a user can see derives from :class:`TileworkError`. Errors that concern a place in
the IR carry the rendered context (the offending binding and its surroundings) so that the
message alone tells what went wrong and where.
"""

from __future__ import annotations


class TileworkError(Exception):
    """Base of every error raised by tilework on purpose."""

    nn_module: str | None = None  # set once tracing has put an nn.Module's context in the message


class TileworkWarning(UserWarning):
    """A warning tilework gives on purpose (a cache entry set aside, files an export left); the
    command line shows it as one ``warning: ...`` line."""


class SymbolicError(TileworkError):
    """A symbolic shape expression is malformed or cannot be evaluated (e.g. division by zero)."""


class ShapeError(TileworkError):
    """Shapes that provably disagree (a static mismatch), or a bad shape argument."""


class InferenceError(TileworkError):
    """An operator cannot infer struct info for its arguments (bad dtype, rank, attribute)."""


class WellFormedError(TileworkError):
    """The IR breaks a well-formedness rule; the message shows the offending binding."""


class ParseError(TileworkError):
    """The text format could not be parsed; the message shows line, column and a caret."""

    def __init__(self, message: str, line: int = 0, column: int = 0) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


class BuildError(TileworkError):
    """Compilation failed (no C compiler, a kernel that does not compile, ...)."""


class RuntimeCheckError(TileworkError):
    """A fact checked at run time does not hold (a shape, dtype or rank of an argument)."""


class IntegerDivisionByZero(RuntimeCheckError, ZeroDivisionError):
    """An integer division or remainder by zero where the source framework raises (torch);
    see docs/semantics.md."""


class IndexOutOfRange(RuntimeCheckError, IndexError):
    """An index outside its dim where the source framework raises (torch's embedding,
    ``index_select``, ``gather``, advanced indexing); see docs/semantics.md."""


class UnsupportedError(TileworkError):
    """The input uses something tilework does not support; the message names it."""


class FileFormatError(TileworkError):
    """A file is not what it should be (another kind of file, truncated, corrupt, unreadable);
    the message names the file and what is wrong with it."""


class ScheduleError(TileworkError):
    """A schedule primitive refused a transformation; the message names the loop or block and
    says why (a carried dependence, loops that are not nested, a non-positive factor, ...)."""


class SpecError(TileworkError):
    """A ``tilework.nn`` input spec does not fit the module: an unknown method or argument, a
    missing argument, a malformed dim or dtype, a bound for a dim no input has."""


class ParameterError(TileworkError):
    """A ``tilework.nn`` parameter has no value when one is needed, or a value of the wrong
    shape or dtype, or a state dict names parameters the module does not have."""
