"""rmqpy for asyncio: the typed producer and consumers on ``zmq.asyncio``.

    import asyncio
    from rmqpy.aio import AsyncProducer, AsyncPullConsumer

    async def main() -> None:
        async with AsyncProducer() as producer:
            await asyncio.gather(*(producer.send("orders", b"%d" % i) for i in range(100)))
        async with AsyncPullConsumer("billing", "orders", idle_timeout_ms=2_000) as consumer:
            async for message in consumer:
                print(message.body)

Every class here sends its requests on one ``AsyncClient``: one DEALER socket with many
requests in flight, their replies matched by request id. Pass one ``client=`` to several
producers and consumers to share a socket. The methods, results and errors are those of
the blocking classes in ``rmqpy``. Use each object from one event loop.
"""

from rmqpy.aio.client import AsyncClient
from rmqpy.aio.pop_consumer import AsyncPopConsumer
from rmqpy.aio.producer import AsyncProducer
from rmqpy.aio.pull_consumer import AsyncPullConsumer

__all__ = ["AsyncClient", "AsyncPopConsumer", "AsyncProducer", "AsyncPullConsumer"]
