"""rmqpy: the typed client library of the message store, for application developers.

    from rmqpy import Producer, PullConsumer

    with Producer() as producer:
        result = producer.send("orders", b"hello", keys=["order-1"], tags="paid")

    with PullConsumer("billing", "orders", subscription="paid", idle_timeout_ms=5_000) as consumer:
        for message in consumer:
            print(message.queue_offset, message.body)

* ``Producer``: ``send``, ``send_batch``, ``send_async`` (a ``concurrent.futures.Future``),
  retries on ``BUSY``; thread-safe.
* ``PullConsumer``: a consumer group over every queue of a topic, long polling, tag
  subscriptions, committed offsets.
* ``PopConsumer``: a worker of a pop group, acking each message.
* ``Cluster``, and ``ClusterProducer``, ``ClusterPullConsumer``, ``ClusterPopConsumer``: the same
  over a cluster of broker sets, a client per set (what ``Producer(cluster=...)`` and the
  consumers given ``cluster=`` return; docs/cluster.md).
* ``rmqpy.aio``: the same for asyncio, many requests in flight on one socket.

Results are frozen ``msgspec.Struct``s (``Message``, ``SendResult``); refusals raise
``EngineError`` with the engine's stable ``code`` (an ``ErrorCode``). docs/client.md is
the guide; ``engine.client.StoreClient`` stays the raw, untyped client for tools.
"""

from engine.client import DEFAULT_ENDPOINT
from rmqpy.cluster import Cluster
from rmqpy.credentials import Credentials
from rmqpy.errors import (
    ClientClosed,
    ClientError,
    ConnectionLost,
    EngineError,
    ErrorCode,
    GetStatus,
    NoMaster,
    PutStatus,
    RequestTimeout,
)
from rmqpy.message import Message, OutgoingMessage, SendResult
from rmqpy.pop_consumer import ClusterPopConsumer, PopConsumer
from rmqpy.producer import ClusterProducer, Producer
from rmqpy.pull_consumer import ClusterPullConsumer, PullConsumer
from rmqpy.retry import RETRIABLE_CODES, RetryPolicy

__all__ = [
    "DEFAULT_ENDPOINT",
    "RETRIABLE_CODES",
    "ClientClosed",
    "ClientError",
    "Cluster",
    "ClusterPopConsumer",
    "ClusterProducer",
    "ClusterPullConsumer",
    "ConnectionLost",
    "Credentials",
    "EngineError",
    "ErrorCode",
    "GetStatus",
    "Message",
    "NoMaster",
    "OutgoingMessage",
    "PopConsumer",
    "Producer",
    "PullConsumer",
    "PutStatus",
    "RequestTimeout",
    "RetryPolicy",
    "SendResult",
]
