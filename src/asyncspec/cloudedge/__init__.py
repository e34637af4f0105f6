"""Cloud–edge speculative decoding (AsymSpec): services, protocol, correction, link emulation."""
