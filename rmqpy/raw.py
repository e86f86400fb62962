"""Two pieces of rmqpy for tools that speak the protocol's maps through the raw client
(``engine.client.StoreClient``) rather than through ``Producer`` and the consumers, as the
``rmqpy`` command line does:

* ``Channel``: a ``StoreClient`` that also keeps many requests in flight on its one socket
  (``submit``, then ``replies``), so that every queue of a topic can be long-polled at once;
* ``UniqKeys``: message ids (``UNIQ_KEY``) made as ``Producer`` makes them, so that a tool
  can name each message it sends by the id its consumers will get.

Their code stays where ``PullConsumer`` and ``Producer`` use it; this is their public name.
"""

from rmqpy._channel import Channel
from rmqpy._send import UniqKeys

__all__ = ["Channel", "UniqKeys"]
