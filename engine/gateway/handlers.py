"""The service's methods registered with grpc, with a request decoder that never raises.

The generated ``add_MessagingServiceServicer_to_server`` decodes with ``FromString``: a request
that is not valid protobuf then ends in grpc's UNKNOWN and a traceback in the log. Here such a
request is answered like any other refusal, with the method's own response carrying
BAD_REQUEST (a stream gets one such response), and the first one of each kind is logged on
one line.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError
from rocketmq.grpc_protocol import Code, service_pb2

from engine.gateway.codes import status

log = logging.getLogger(__name__)

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"


class Malformed:
    """Stands for a request that did not decode."""

    def __init__(self, error: str) -> None:
        self.error = error


def _decoder(request_type: Any) -> Callable[[bytes], Any]:
    logged = False

    def decode(data: bytes) -> Any:
        nonlocal logged
        try:
            return request_type.FromString(data)
        except (DecodeError, ValueError, RuntimeError) as exc:
            if not logged:
                log.warning("a %s that is not valid protobuf was refused (%s)", request_type.__name__, exc)
                logged = True
            return Malformed(str(exc))
    return decode


def _refusal(response_type: Any, request: Malformed) -> Any:
    return response_type(status=status(Code.BAD_REQUEST, f"the request is not valid protobuf: {request.error}"))


def generic_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """Every method of the MessagingService descriptor that ``servicer`` defines (its class and
    the classes between it and the generated base, which, with ``object``, end its MRO)."""
    service = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
    handlers = {}
    for method in service.methods:
        if not any(method.name in vars(cls) for cls in type(servicer).__mro__[:-2]):
            continue  # the generated base's stub: grpc answers UNIMPLEMENTED for a method not registered
        behaviour = getattr(servicer, method.name)
        request_type = message_factory.GetMessageClass(method.input_type)
        response_type = message_factory.GetMessageClass(method.output_type)
        decode, encode = _decoder(request_type), response_type.SerializeToString
        if method.client_streaming and method.server_streaming:
            handler = grpc.stream_stream_rpc_method_handler(_bidi(behaviour, response_type), decode, encode)
        elif method.server_streaming:
            handler = grpc.unary_stream_rpc_method_handler(_server_stream(behaviour, response_type), decode, encode)
        else:
            handler = grpc.unary_unary_rpc_method_handler(_unary(behaviour, response_type), decode, encode)
        handlers[method.name] = handler
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def _unary(behaviour: Any, response_type: Any) -> Any:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            return _refusal(response_type, request)
        return await behaviour(request, context)
    return call


def _server_stream(behaviour: Any, response_type: Any) -> Any:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, Malformed):
            yield _refusal(response_type, request)
            return
        async for response in behaviour(request, context):
            yield response
    return call


def _bidi(behaviour: Any, response_type: Any) -> Any:
    async def call(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        refusals: list[Any] = []

        async def decoded() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Malformed):
                    refusals.append(_refusal(response_type, request))
                else:
                    yield request

        async for response in behaviour(decoded(), context):
            while refusals:
                yield refusals.pop(0)
            yield response
        while refusals:
            yield refusals.pop(0)
    return call
