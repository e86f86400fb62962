"""Inter-process communication: the client protocol, internal messages, endpoints."""
