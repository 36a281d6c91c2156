"""Errors shared by the stage parser and the switches it applies (a module of its own so neither imports the other)."""


class StageError(ValueError):
    """An unknown stage name or a combination that cannot be built."""
