"""The replication sender's service: a master's side of replication.

Called by ``engine/actors/replication_sender.py``:

``log_shipping.py``, ``LogShipping``
    What each replica has, the log bytes it is sent next, and whether it is in sync. Its
    ``SHIPPED_CONFIG_FILES`` are also the files the receiver replaces and the front rereads.
"""
