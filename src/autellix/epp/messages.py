"""Envoy's ext_proc messages, read and built: the only module that touches their protobuf types.

Reading: a headers message as a plain dict (keys lower case, as Envoy sends them),
metadata and attributes as dicts, the body send modes Envoy announced. Building:
the answers a picker sends back (headers and body answers with header mutations,
streamed body chunks, the routing answer's dynamic metadata, trailers, immediate
responses). The types are ``xds-protos``' (Envoy's data-plane API compiled for
``protobuf``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.type.v3 import http_status_pb2
from google.protobuf import json_format, struct_pb2
from multidict import CIMultiDict

from autellix.epp.contract import BODY_CHUNK_BYTES

ProcessingRequest = ext_proc.ProcessingRequest
ProcessingResponse = ext_proc.ProcessingResponse
BodySendMode = processing_mode_pb2.ProcessingMode.BodySendMode
NONE, STREAMED, BUFFERED = BodySendMode.NONE, BodySendMode.STREAMED, BodySendMode.BUFFERED
FULL_DUPLEX_STREAMED = BodySendMode.FULL_DUPLEX_STREAMED
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


# ---- reading ------------------------------------------------------------------------------
def header_dict(headers: ext_proc.HttpHeaders) -> CIMultiDict[str]:
    """The headers, looked up by any case of their names, as HTTP has it (pseudo-headers ``:path``,
    ``:method``, ``:status`` included); ``get`` gives a repeated header's first value."""
    out: CIMultiDict[str] = CIMultiDict()
    for header in headers.headers.headers:
        out.add(header.key, header.raw_value.decode("latin-1") if header.raw_value else header.value)
    return out


def struct_dict(structs: Mapping[str, struct_pb2.Struct]) -> dict[str, dict[str, Any]]:
    """A map of namespace -> Struct (filter metadata, attributes) as plain dicts."""
    return {name: json_format.MessageToDict(value) for name, value in structs.items()}


def metadata_of(request: ProcessingRequest) -> dict[str, dict[str, Any]]:
    return struct_dict(request.metadata_context.filter_metadata) if request.HasField("metadata_context") else {}


def attributes_of(request: ProcessingRequest) -> dict[str, dict[str, Any]]:
    return struct_dict(request.attributes)


def body_modes(request: ProcessingRequest) -> tuple[int, int] | None:
    """(request body mode, response body mode) as Envoy announced them on the stream's first message;
    None when it did not (an older data plane)."""
    if not request.HasField("protocol_config"):
        return None
    return request.protocol_config.request_body_mode, request.protocol_config.response_body_mode


# ---- building ------------------------------------------------------------------------------
def _set(headers: Mapping[str, str]) -> list[base_pb2.HeaderValueOption]:
    """Header mutations that replace any value the request came with (a client cannot choose its endpoint)."""
    return [base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, raw_value=v.encode("latin-1")),
                                       append_action=_OVERWRITE) for k, v in headers.items()]


def _common(set_headers: Mapping[str, str] | None = None, remove: Sequence[str] = (), *,
            clear_route_cache: bool = False, body: bytes | None = None) -> ext_proc.CommonResponse:
    common = ext_proc.CommonResponse(clear_route_cache=clear_route_cache)
    if set_headers or remove:
        common.header_mutation.CopyFrom(ext_proc.HeaderMutation(set_headers=_set(set_headers or {}),
                                                                remove_headers=list(remove)))
    if body is not None:
        common.body_mutation.body = body
    return common


def metadata_struct(values: Mapping[str, Mapping[str, str]]) -> struct_pb2.Struct:
    """Dynamic metadata: namespace -> key -> string."""
    out = struct_pb2.Struct()
    for namespace, entries in values.items():
        out.fields[namespace].struct_value.update(dict(entries))
    return out


def headers_answer(*, request: bool, set_headers: Mapping[str, str] | None = None, remove: Sequence[str] = (),
                   clear_route_cache: bool = False,
                   metadata: Mapping[str, Mapping[str, str]] | None = None) -> ProcessingResponse:
    """The answer to a request's (``request``) or a response's headers."""
    answer = ext_proc.HeadersResponse(response=_common(set_headers, remove, clear_route_cache=clear_route_cache))
    out = ProcessingResponse(request_headers=answer) if request else ProcessingResponse(response_headers=answer)
    if metadata:
        out.dynamic_metadata.CopyFrom(metadata_struct(metadata))
    return out


def body_answer(*, request: bool, body: bytes | None = None, set_headers: Mapping[str, str] | None = None,
                clear_route_cache: bool = False,
                metadata: Mapping[str, Mapping[str, str]] | None = None) -> ProcessingResponse:
    """The answer to a whole (``BUFFERED``) or a ``STREAMED`` body message: the bytes that replace it
    (None: unchanged) and, buffered, header mutations."""
    answer = ext_proc.BodyResponse(response=_common(set_headers, clear_route_cache=clear_route_cache, body=body))
    out = ProcessingResponse(request_body=answer) if request else ProcessingResponse(response_body=answer)
    if metadata:
        out.dynamic_metadata.CopyFrom(metadata_struct(metadata))
    return out


def streamed_answers(data: bytes, *, request: bool, end: bool) -> Iterator[ProcessingResponse]:
    """``FULL_DUPLEX_STREAMED`` body answers carrying ``data`` in chunks of at most ``BODY_CHUNK_BYTES``;
    ``end``: the last one ends the body (an empty ``data`` still sends that end)."""
    pieces = [data[i:i + BODY_CHUNK_BYTES] for i in range(0, len(data), BODY_CHUNK_BYTES)] or [b""]
    for index, piece in enumerate(pieces):
        mutation = ext_proc.BodyMutation(streamed_response=ext_proc.StreamedBodyResponse(
            body=piece, end_of_stream=end and index == len(pieces) - 1))
        answer = ext_proc.BodyResponse(response=ext_proc.CommonResponse(body_mutation=mutation))
        yield ProcessingResponse(request_body=answer) if request else ProcessingResponse(response_body=answer)


def trailers_answer(*, request: bool) -> ProcessingResponse:
    answer = ext_proc.TrailersResponse()
    return ProcessingResponse(request_trailers=answer) if request else ProcessingResponse(response_trailers=answer)


def immediate(status: int, body: bytes, headers: Mapping[str, str], details: str) -> ProcessingResponse:
    """A reply Envoy sends in the picker's place (the call goes nowhere): ``details`` is what Envoy's
    access log shows as the response code details."""
    return ProcessingResponse(immediate_response=ext_proc.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status), body=body, details=details,
        headers=ext_proc.HeaderMutation(set_headers=_set(headers))))


__all__ = ["BUFFERED", "FULL_DUPLEX_STREAMED", "NONE", "STREAMED", "BodySendMode", "ProcessingRequest",
           "ProcessingResponse", "attributes_of", "body_answer", "body_modes", "header_dict", "headers_answer",
           "immediate", "metadata_of", "metadata_struct", "streamed_answers", "struct_dict", "trailers_answer"]
