"""Offline tools over a store directory: inspect, check and repair."""
