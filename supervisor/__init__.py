"""Starts, watches and stops the engine's actor processes."""
