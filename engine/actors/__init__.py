"""The engine's actors, each its own OS process, and the runtime they run in.

An actor module is its logic as a handler: the ports it takes messages on, the
messages it handles there and the effects it gives (``effects.py``). ``base.py``
is the runtime that owns the sockets, shared offsets, clock and threads;
``harness/simulation`` is another runtime for the same handlers.
"""
