// What the native floors answer Envoy: every call to one endpoint, bodies held or passed as the picker does.
//
// FULL_DUPLEX_STREAMED request bodies (GIE's mode) are held to their end and sent back whole with the routing
// headers; BUFFERED and NONE bodies are answered at once; the response is passed through.
#pragma once

#include <string>
#include <utility>

#include "envoy/service/ext_proc/v3/external_processor.grpc.pb.h"

namespace floor_answers {

namespace ep = envoy::service::ext_proc::v3;
using Mode = envoy::extensions::filters::http::ext_proc::v3::ProcessingMode;

// One stream's state between its messages.
struct Stream {
  bool duplex = false;
  std::string body;
};

// The destination header, as autellix epp sets it, and the route cache cleared.
inline void Route(ep::CommonResponse* common, const std::string& endpoint) {
  common->set_clear_route_cache(true);
  auto* h = common->mutable_header_mutation()->add_set_headers();
  h->mutable_header()->set_key("x-gateway-destination-endpoint");
  h->mutable_header()->set_raw_value(endpoint);
  h->set_append_action(envoy::config::core::v3::HeaderValueOption::OVERWRITE_IF_EXISTS_OR_ADD);
}

// The same endpoint under envoy.lb in the dynamic metadata.
inline void Metadata(ep::ProcessingResponse* r, const std::string& endpoint) {
  (*(*r->mutable_dynamic_metadata()->mutable_fields())["envoy.lb"].mutable_struct_value()->mutable_fields())
      ["x-gateway-destination-endpoint"].set_string_value(endpoint);
}

// A streamed body answer carrying ``data``.
inline ep::ProcessingResponse Streamed(bool request, const std::string& data, bool end) {
  ep::ProcessingResponse r;
  auto* body = request ? r.mutable_request_body() : r.mutable_response_body();
  auto* s = body->mutable_response()->mutable_body_mutation()->mutable_streamed_response();
  s->set_body(data);
  s->set_end_of_stream(end);
  return r;
}

// Answers one message of the stream through ``send`` (none while a duplex request body is still coming).
template <typename Send>
void Answer(const ep::ProcessingRequest& req, Stream& stream, const std::string& endpoint, Send send) {
  ep::ProcessingResponse r;
  switch (req.request_case()) {
    case ep::ProcessingRequest::kRequestHeaders:
      stream.duplex = req.has_protocol_config() &&
                      req.protocol_config().request_body_mode() == Mode::FULL_DUPLEX_STREAMED;
      if (stream.duplex && !req.request_headers().end_of_stream()) return;  // answered with the body's end
      if (req.request_headers().end_of_stream()) Route(r.mutable_request_headers()->mutable_response(), endpoint);
      else r.mutable_request_headers();
      break;
    case ep::ProcessingRequest::kRequestBody:
      if (stream.duplex) {
        stream.body += req.request_body().body();
        if (!req.request_body().end_of_stream()) return;
        Route(r.mutable_request_headers()->mutable_response(), endpoint);
        Metadata(&r, endpoint);
        send(std::move(r));
        send(Streamed(true, stream.body, true));
        return;
      }
      Route(r.mutable_request_body()->mutable_response(), endpoint);
      Metadata(&r, endpoint);
      break;
    case ep::ProcessingRequest::kResponseHeaders:
      r.mutable_response_headers();
      break;
    case ep::ProcessingRequest::kResponseBody:
      if (stream.duplex) {
        send(Streamed(false, req.response_body().body(), req.response_body().end_of_stream()));
        return;
      }
      r.mutable_response_body();
      break;
    case ep::ProcessingRequest::kRequestTrailers:
      r.mutable_request_trailers();
      break;
    case ep::ProcessingRequest::kResponseTrailers:
      r.mutable_response_trailers();
      break;
    default:
      return;
  }
  send(std::move(r));
}

}  // namespace floor_answers
