"""One ext_proc stream whose answers cannot be written: Envoy ended it (its client left).

The exchange is driven with Envoy's own message types, the way the gRPC server drives it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from autellix.epp.exchange import Exchange, GatewayLeg, RequestHead, Routing, StreamGone
from autellix.protocol import APIError


def request_headers(path: str) -> ext_proc.ProcessingRequest:
    headers = [base_pb2.HeaderValue(key=key, raw_value=value.encode())
               for key, value in ((":method", "GET"), (":path", path))]
    return ext_proc.ProcessingRequest(request_headers=ext_proc.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=headers), end_of_stream=True))


async def messages(*items: ext_proc.ProcessingRequest) -> AsyncIterator[ext_proc.ProcessingRequest]:
    for item in items:
        yield item


class RoutesAtOnce:
    async def decide(self, head: RequestHead, body: bytes | None, leg: GatewayLeg) -> None:
        await leg.route(Routing(["10.0.0.1:8000"]))


def no_error_answer(exc: APIError, head: RequestHead) -> tuple[int, bytes, dict[str, str]]:
    raise AssertionError("nothing was refused")


@pytest.mark.asyncio
async def test_an_answer_to_a_stream_envoy_ended_is_stream_gone() -> None:
    written: list[ext_proc.ProcessingResponse] = []

    async def write(answer: ext_proc.ProcessingResponse) -> None:
        written.append(answer)
        raise RuntimeError("Failed \"execute_batch\"")  # what grpc.aio raises for a write to an ended stream

    exchange = Exchange(messages(request_headers("/v1/models")), write, RoutesAtOnce(), no_error_answer,
                        max_body_bytes=1024)
    with pytest.raises(StreamGone):
        await exchange.run()
    assert len(written) == 1 and written[0].HasField("request_headers")
    assert not exchange.routed  # the routing answer never reached Envoy


@pytest.mark.asyncio
async def test_a_stream_whose_answers_go_out_is_routed() -> None:
    written: list[ext_proc.ProcessingResponse] = []

    async def write(answer: ext_proc.ProcessingResponse) -> None:
        written.append(answer)

    exchange = Exchange(messages(request_headers("/v1/models")), write, RoutesAtOnce(), no_error_answer,
                        max_body_bytes=1024)
    await exchange.run()
    assert exchange.routed and len(written) == 1
