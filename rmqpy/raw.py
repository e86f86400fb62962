"""Two pieces of rmqpy for tools that speak the protocol's maps through the raw client
(``engine.client.StoreClient``) rather than through ``Producer`` and the consumers, as the
``rmqpy`` command line does:

* ``Channel``: a ``StoreClient`` that also keeps many requests in flight on its one socket
  (``submit``, then ``replies``), so that every queue of a topic can be long-polled at once;
* ``UniqKeys``: message ids (``UNIQ_KEY``) made as ``Producer`` makes them, so that a tool
  can name each message it sends by the id its consumers will get;
* ``SetClient``: a ``StoreClient`` on a broker set's address (its engines, comma-separated) whose
  requests go to the master and follow it across a failover, as ``Producer``'s sends do.

Their code stays where ``PullConsumer`` and ``Producer`` use it; this is their public name.
"""

from rmqpy._channel import Channel
from rmqpy._send import UniqKeys
from rmqpy._set_client import SetClient

__all__ = ["Channel", "SetClient", "UniqKeys"]
