"""The transaction actor's services: half messages, op records, the producers' decisions.

Called by ``engine/actors/transactions.py``, which sends the moves and the answers:

``halves.py``, ``TransactionHalves``
    The undecided half messages and RocketMQ's check service over them.
``ops.py``, ``TransactionOps``
    The op records (``RMQ_SYS_TRANS_OP_HALF_TOPIC``): read in order, applied in order.
``decisions.py``, ``TransactionDecisions``
    The producers' ``end_transaction`` decisions, and who waits for them.
"""
