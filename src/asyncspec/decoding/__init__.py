"""Decoding methods. Every method has one signature: decode(target, drafter, request, config)."""
