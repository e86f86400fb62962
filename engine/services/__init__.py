"""The actors' jobs as plain objects over the store's files, a package per actor they serve.

They decide; the actors (``engine/actors/``) call them and carry the answers over sockets.
They import no actor or metrics module. Each package's docstring maps its modules:

``front/``
    The front: topic rules and deletions, consumer groups and their members, key lookups,
    its figures, the config files a replica's front rereads.
``writer/``
    The writer: appends and where each send is stored, the sends waiting for SYNC_FLUSH or
    the replicas, the deletion table, retention.
``owner/``
    The ConsumeQueue owners: the queues each holds, pulls, long polls, queue questions.
``pop/``
    Pop consumers: the queue indexes the owners keep, and the front's fan-out of a pop.
``timer/``
    The timer: enqueue into the timer log, delivery when due.
``transactions/``
    The transaction actor: half messages, op records, the producers' decisions.
``replication/``
    The replication sender: what each replica has and the log bytes it is sent next.

Used by several actors, and so at the top:

``recovery.py``
    The CommitLog's recovery plan: the writer applies it, ``inspect`` prints it, the broker
    membership reads it.
``restart_points.py``
    Where each actor starts again after a crash: the store's cross-actor invariant.
``log_slices.py``
    A slice of the log read for catch-up: the owners, the index builder, ``moved_records.py``.
``moved_records.py``
    Which system-topic records were already moved: the timer's and the transaction actor's
    restart check.
"""
