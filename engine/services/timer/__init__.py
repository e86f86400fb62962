"""The timer's services: delayed messages into the timer log, and out again when due.

Called by ``engine/actors/timer.py``, which holds the files and sends the moves:

``enqueue.py``, ``TimerEnqueue``
    Each delayed message pulled from ``rmq_sys_wheel_timer`` becomes a unit in the wheel slot
    of its deliver time.
``delivery.py``, ``TimerDelivery``
    Which messages are due, their moves to their real topic, and what became of each.
"""
