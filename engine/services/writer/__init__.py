"""The writer's services: the appends, the sends that wait, the deletion table, retention.

Called by ``engine/actors/commit_log_writer.py``, the log's only appender:

``log_appends.py``, ``LogAppends``
    A send's batch checked, given its queue offsets and appended whole.
``delivery_routes.py``, ``destination``
    Where a send is stored: its own queue, or the system topic of a delayed or transactional send.
``sync_acks.py``, ``SyncAcks``, ``OwnSync``
    The sends that wait for the flush (SYNC_FLUSH) or the replicas (SYNC replication).
``deletion_records.py``, ``DeletionRecords``
    Where each topic deletion falls in the log, the table's writes group-committed.
``retention_rounds.py``, ``RetentionRounds``
    A retention round: the facts gathered, the plan carried out, what it cost.
``retention.py``, ``plan_deletions``
    The round's decision: which segments go, and when sends are refused for a full disk.
"""
