"""Decoder backends and the offline weights they load."""
