"""Dead letters: deliveries that go to the group's dead-letter topic instead of being due again.

A delivery due again after ``max_delivery_attempts`` (or given up by its consumer: ``ack``
with ``dead_letter``) is sent, as a new message of ``%DLQ%{group}`` (queue 0, created by
the front at the group's first pop), to the writer; the queue index records DEAD when the
writer's reply says it is stored. A send that is refused or not answered within
``dead_letter_retry_ms`` is sent again (the DLQ may then hold it twice: at least once).

Called by the owner's pop glue (``engine/actors/owner_pops.py``), which forwards each send
to the writer: ``letter`` builds one, ``overdue`` gives those to send again, ``answered``
reads the writer's reply.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import msgspec

from engine.ipc.protocol import MessageView, SendMessage, SendReply, SendRequest
from engine.names import dead_letter_topic
from engine.services.pop.queue_index import QueueIndex

log = logging.getLogger(__name__)
_view_decoder = msgspec.msgpack.Decoder(MessageView)
_reply_decoder = msgspec.msgpack.Decoder(SendReply)
_encoder = msgspec.msgpack.Encoder()


@dataclass
class DeadLetter:
    queue: QueueIndex
    offset: int
    generation: int
    deadline_ms: int


class DeadLetters:
    """The dead-letter sends waiting for the writer's reply, by the client id they went with."""

    def __init__(self) -> None:
        self.waiting: dict[bytes, DeadLetter] = {}
        self.ids = itertools.count(1)

    def letter(self, queue: QueueIndex, offset: int, generation: int, encoded_view: bytes,
               deadline_ms: int) -> tuple[bytes, bytes]:
        """The send that moves the message (``encoded_view``, as a pull reads it) to the group's
        dead-letter topic: (the client id it goes with, the request frame)."""
        group, topic, queue_id = queue.key
        view = _view_decoder.decode(encoded_view)
        _state, attempt, _generation, _until = queue.entry(offset)
        properties = dict(view.properties)
        properties.update({"DLQ_ORIGIN_TOPIC": topic, "DLQ_ORIGIN_MESSAGE_ID": view.msg_id,
                           "DLQ_ORIGIN_QUEUE_ID": str(queue_id), "DLQ_ORIGIN_QUEUE_OFFSET": str(offset),
                           "DLQ_DELIVERY_ATTEMPTS": str(attempt)})
        message = SendMessage(body=view.body, tags=view.tags, keys=view.keys, properties=properties,
                              flag=view.flag, born_timestamp=view.born_timestamp)
        request_id = next(self.ids)
        request = SendRequest(op="send", id=request_id, topic=dead_letter_topic(group), queue_id=0,
                              messages=[message])
        client = b"dlq:%d" % request_id
        queue.dead_lettering.add(offset)
        self.waiting[client] = DeadLetter(queue, offset, generation, deadline_ms)
        return client, _encoder.encode(request)

    def overdue(self, now_ms: int) -> list[DeadLetter]:
        """The sends past their deadline, forgotten here: to be sent again."""
        late = [client for client, letter in self.waiting.items() if letter.deadline_ms <= now_ms]
        letters = [self.waiting.pop(client) for client in late]
        for letter in letters:
            letter.queue.dead_lettering.discard(letter.offset)
        return letters

    def answered(self, client: bytes, frame: bytes) -> tuple[DeadLetter, SendReply | None] | None:
        """The letter the writer's reply ``frame`` answers, and the reply (None if it does not read
        as one: the letter is then sent again); None if the letter was sent again since."""
        letter = self.waiting.pop(client, None)
        if letter is None:
            return None
        letter.queue.dead_lettering.discard(letter.offset)
        try:
            return letter, _reply_decoder.decode(frame)
        except (msgspec.DecodeError, ValueError, RecursionError) as exc:
            log.error("the writer's reply to a dead-letter send does not read as one (%s)", exc)
            return letter, None
