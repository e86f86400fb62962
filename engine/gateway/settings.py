"""The settings the endpoint sends back on a client's telemetry stream.

A RocketMQ 5 client opens ``Telemetry`` first and sends its ``Settings``; the server answers
with the settings the client must use. Producers and push consumers wait for that answer
before their start-up returns. The answer is the client's own settings with the server's
part filled in, as RocketMQ's proxy does:

* producers: the retry backoff (exponential, 10 ms to 1 s) and ``publishing``: the largest
  body (``message_body_bytes_max``) and message-type validation;
* consumers: ``subscription`` with the receive batch size and the long-polling time, and the
  retry policy of a push consumer: ``max_delivery_attempts`` attempts, the n-th redelivery
  ``grpc_retry_delays_ms[n - 1]`` after a failure (RocketMQ's delay levels from 1 s).
"""

from __future__ import annotations

from rocketmq.grpc_protocol import ClientType, Settings, definition_pb2

from engine.config import StoreConfig
from engine.gateway.messages import duration

RECEIVE_BATCH_SIZE = 32  # what RocketMQ's proxy tells push consumers
_PRODUCER_MAX_ATTEMPTS = 3
_PRODUCER_BACKOFF_INITIAL_MS = 10
_PRODUCER_BACKOFF_MAX_MS = 1000


def answer(client: Settings, config: StoreConfig) -> Settings:
    settings = Settings()
    settings.CopyFrom(client)
    if client.client_type == ClientType.PRODUCER:
        attempts = client.backoff_policy.max_attempts or _PRODUCER_MAX_ATTEMPTS
        settings.backoff_policy.CopyFrom(definition_pb2.RetryPolicy(
            max_attempts=attempts,
            exponential_backoff=definition_pb2.ExponentialBackoff(
                initial=duration(_PRODUCER_BACKOFF_INITIAL_MS), max=duration(_PRODUCER_BACKOFF_MAX_MS),
                multiplier=2.0)))
        settings.publishing.max_body_size = config.message_body_bytes_max
        settings.publishing.validate_message_type = True
    elif client.HasField("subscription"):
        settings.subscription.fifo = client.subscription.group.name in config.fifo_groups
        settings.subscription.receive_batch_size = RECEIVE_BATCH_SIZE
        settings.subscription.long_polling_timeout.CopyFrom(duration(config.grpc_long_polling_ms))
        settings.backoff_policy.CopyFrom(definition_pb2.RetryPolicy(
            max_attempts=config.max_delivery_attempts,
            customized_backoff=definition_pb2.CustomizedBackoff(
                next=[duration(ms) for ms in config.grpc_retry_delays_ms])))
    return settings
