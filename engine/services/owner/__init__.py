"""A ConsumeQueue owner's services: the queues it holds, and the reads it serves from them.

Called by ``engine/actors/consume_queue_owner.py`` (and its pops, ``engine/actors/owner_pops.py``,
whose logic is the package ``engine/services/pop/``):

``owned_queues.py``, ``OwnedQueues``
    The owner's ConsumeQueues kept equal to the log: dispatch, catch-up, healing, retention.
``queue_reads.py``, ``QueueReads``
    The reads it serves: pulls (at once or parked), one record by id or offset, queue questions.
``pull.py``, ``pull``, ``Subscription``
    One pull from one ConsumeQueue, with RocketMQ's statuses (``engine/local_reads.py`` runs it
    too, on the engine's host).
``long_poll.py``, ``LongPolls``
    Pulls that found nothing new, parked until a message arrives or their time is up.
``queue_queries.py``, ``queue_stats``, ``offset_for_time``
    Questions about one queue, answered from its units and the records they point at.
"""
