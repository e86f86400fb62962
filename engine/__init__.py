"""A RocketMQ-format message store served by actor processes over ZeroMQ."""

__version__ = "0.1.0"
