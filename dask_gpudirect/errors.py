"""The one error type for bad input, so users can catch it and tests can assert on it."""

from __future__ import annotations

import os


class InputError(ValueError):
    """A file or an option that cannot be loaded; the message names the file and the fault."""

    def __init__(self, path: str | os.PathLike | None, problem: str):
        self.path = None if path is None else os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)

    def __reduce__(self):
        return type(self), (self.path, self.problem)


class ShuffleError(RuntimeError):
    """A shuffle that could not finish; no partial output was returned and the cluster is usable."""
