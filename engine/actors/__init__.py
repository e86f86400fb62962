"""The engine's actors: each module here runs as its own OS process."""
