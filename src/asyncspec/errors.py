"""Errors a user can act on. The CLI prints them on one line and exits with code 2."""


class InputError(ValueError):
    """Bad input from the user: an unreadable file, not audio, empty, too long, an unknown model."""


class ModelNotPreparedError(RuntimeError):
    """A registered model's weights are not in the local cache and cannot be assembled here."""
