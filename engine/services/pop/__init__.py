"""Pop consumers: RabbitMQ's queue index over a RocketMQ queue, kept by the queue's owner.

Which part does what (a pop goes down this list and comes back up it, once):

``engine/actors/owner_pops.py``, ``OwnerPops``
    The owner's handler glue: decodes pop, ack, change_invisible and pop_stats, calls the
    parts below, encodes the replies and holds them for the journal's sync (SYNC_FLUSH);
    sends dead letters to the writer.
``delivery.py``
    Delivery and ack logic over one queue index: ``take`` (due redeliveries first, then new
    messages from the pop cursor), ``ack``, ``change_invisible``, and the receipt handles
    that name a delivery (``encode_handle``, ``HandleTags``).
``dead_letters.py``, ``DeadLetters``
    Deliveries past ``max_delivery_attempts`` (or given up by the consumer): the send that
    moves each to ``%DLQ%{group}``, the sends waiting for the writer, and what its reply means.
``index_set.py``, ``IndexSet``
    Every queue index one owner holds: opens (recovers) each once, writes and syncs their
    journals, folds them, drops those of a deleted topic; and the timers of their invisible
    times (one heap, one entry per pop batch).
``queue_index.py``, ``QueueIndex``
    The queue index of one (group, topic, queue): the state of each queue offset in
    memory, the journal entries of each change, the fold into segments, recovery.
``fan_out.py``, ``PopFanOut``
    At the front, before any of the above: which owners a pop without a queue id asks, in
    which order (each owner hands it back, ``PopElsewhere``, when it has nothing now).
``engine/store/pop_files.py``
    The files: the journal's and the segments' byte layouts, drawn beside their structs.
"""
