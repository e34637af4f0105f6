"""asyncspec: speculative decoding that decouples drafting from verification."""

__version__ = "0.1.0"
