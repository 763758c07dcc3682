"""GIE's endpoint picker protocol: endpoints, the subset hint, the served endpoint, and the answers' framing."""

from __future__ import annotations

import pytest

from autellix.epp.contract import (
    BODY_CHUNK_BYTES,
    NotAnEndpoint,
    endpoint_list,
    endpoint_of,
    parse_endpoints,
    served_of,
    subset_of,
)
from autellix.epp.messages import ProcessingResponse, headers_answer, immediate, streamed_answers


def test_engine_urls_become_ip_port_endpoints() -> None:
    assert endpoint_of("http://10.0.0.5:8000") == "10.0.0.5:8000"
    assert endpoint_of("http://10.0.0.5:8000/") == "10.0.0.5:8000"
    assert endpoint_of("http://[fd00::5]:8000") == "[fd00::5]:8000"
    assert endpoint_of("http://10.0.0.5") == "10.0.0.5:80"
    with pytest.raises(NotAnEndpoint, match="IP address"):
        endpoint_of("http://engine-0.engines:8000")  # a gateway routes to ip:port, never a name
    assert endpoint_list(["10.0.0.5:8000", "[fd00::5]:8000"]) == "10.0.0.5:8000,[fd00::5]:8000"


def test_endpoint_lists_parse_from_headers_and_metadata() -> None:
    assert parse_endpoints("10.0.0.1:8000, 10.0.0.2:8000,") == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert parse_endpoints(["10.0.0.1:8000", "10.0.0.2:8000,10.0.0.3:8000"]) == [
        "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
    assert parse_endpoints(None) == [] and parse_endpoints(7) == []


def test_the_subset_hint_is_absent_empty_or_a_list() -> None:
    assert subset_of({}) is None
    assert subset_of({"envoy.lb.subset_hint": {"other": 1}}) is None
    assert subset_of({"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": []}}) == []
    assert subset_of({"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": ["10.0.0.1:8000"]}}) == [
        "10.0.0.1:8000"]


def test_the_served_endpoint_comes_from_the_protocol_metadata_else_the_upstream_address() -> None:
    metadata = {"envoy.lb": {"x-gateway-destination-endpoint-served": "10.0.0.2:8000"}}
    attributes = {"envoy.filters.http.ext_proc": {"upstream.address": "10.0.0.3:8000"}}
    assert served_of(metadata, attributes) == "10.0.0.2:8000"
    assert served_of({}, attributes) == "10.0.0.3:8000"
    assert served_of({"envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.1:8000"}}, {}) is None


def test_a_streamed_body_goes_back_in_chunks_that_envoy_takes_the_last_ending_it() -> None:
    body = bytes(range(256)) * ((2 * BODY_CHUNK_BYTES) // 256 + 10)
    answers = list(streamed_answers(body, request=True, end=True))
    chunks = [a.request_body.response.body_mutation.streamed_response for a in answers]
    assert len(chunks) == 3 and all(len(c.body) <= BODY_CHUNK_BYTES for c in chunks)
    assert b"".join(c.body for c in chunks) == body
    assert [c.end_of_stream for c in chunks] == [False, False, True]
    (empty,) = streamed_answers(b"", request=False, end=True)  # an empty body still ends the stream
    assert empty.response_body.response.body_mutation.streamed_response.end_of_stream


def test_the_routing_answer_overwrites_the_header_and_carries_the_same_value_in_metadata() -> None:
    answer = headers_answer(request=True, set_headers={"x-gateway-destination-endpoint": "10.0.0.1:8000"},
                            clear_route_cache=True,
                            metadata={"envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.1:8000"}})
    parsed = ProcessingResponse.FromString(answer.SerializeToString())  # as Envoy reads it off the wire
    common = parsed.request_headers.response
    (option,) = common.header_mutation.set_headers
    assert (option.header.key, option.header.raw_value) == ("x-gateway-destination-endpoint", b"10.0.0.1:8000")
    assert option.append_action == option.OVERWRITE_IF_EXISTS_OR_ADD  # a client's own value never survives
    assert common.clear_route_cache
    lb = parsed.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-gateway-destination-endpoint"].string_value == "10.0.0.1:8000"
    refusal = ProcessingResponse.FromString(immediate(429, b"{}", {"retry-after": "1"}, "shed").SerializeToString())
    assert refusal.immediate_response.status.code == 429
