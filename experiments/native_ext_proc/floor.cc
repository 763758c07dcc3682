// Envoy's ext_proc stream answered in native code with the least decision: the floor of a native picker.
//
// Every call goes to ENDPOINT (the x-gateway-destination-endpoint header and the envoy.lb metadata, as
// autellix epp answers). Bodies Envoy sends FULL_DUPLEX_STREAMED (GIE's mode) are held to their end and
// sent back whole, as the picker does; BUFFERED and NONE bodies are answered at once. What it costs a call
// is gRPC C++'s stream (its callback API) and protobuf: what a native ext_proc front would cost before any
// decision. Built by build.sh; run by experiments/picker_floor.py --native.
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <iostream>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include "envoy/service/ext_proc/v3/external_processor.grpc.pb.h"

namespace ep = envoy::service::ext_proc::v3;
using grpc::CallbackServerContext;
using grpc::ServerBidiReactor;
using grpc::Status;

static std::string g_endpoint;

static void route(ep::CommonResponse* common) {
  common->set_clear_route_cache(true);
  auto* h = common->mutable_header_mutation()->add_set_headers();
  h->mutable_header()->set_key("x-gateway-destination-endpoint");
  h->mutable_header()->set_raw_value(g_endpoint);
  h->set_append_action(envoy::config::core::v3::HeaderValueOption::OVERWRITE_IF_EXISTS_OR_ADD);
}

static void metadata(ep::ProcessingResponse* r) {
  (*(*r->mutable_dynamic_metadata()->mutable_fields())["envoy.lb"].mutable_struct_value()->mutable_fields())
      ["x-gateway-destination-endpoint"].set_string_value(g_endpoint);
}

class Stream : public ServerBidiReactor<ep::ProcessingRequest, ep::ProcessingResponse> {
 public:
  Stream() { StartRead(&req_); }
  void OnReadDone(bool ok) override {
    if (!ok) { MaybeFinish(); return; }
    Handle();
    StartRead(&req_);
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    out_.pop_front();
    if (!ok) { out_.clear(); }
    if (!out_.empty()) StartWrite(&out_.front());
    else if (done_reading_ && !finished_) { finished_ = true; Finish(Status::OK); }
  }
  void OnDone() override { delete this; }

 private:
  void Send(ep::ProcessingResponse&& r) {
    std::lock_guard<std::mutex> lock(mu_);
    out_.push_back(std::move(r));
    if (out_.size() == 1) StartWrite(&out_.front());
  }
  void MaybeFinish() {
    std::lock_guard<std::mutex> lock(mu_);
    done_reading_ = true;
    if (out_.empty() && !finished_) { finished_ = true; Finish(Status::OK); }
  }
  void Handle() {
    ep::ProcessingResponse r;
    switch (req_.request_case()) {
      case ep::ProcessingRequest::kRequestHeaders:
        duplex_ = req_.has_protocol_config() &&
                  req_.protocol_config().request_body_mode() ==
                      envoy::extensions::filters::http::ext_proc::v3::ProcessingMode::FULL_DUPLEX_STREAMED;
        if (duplex_ && !req_.request_headers().end_of_stream()) return;  // answered with the body's end
        if (req_.request_headers().end_of_stream()) route(r.mutable_request_headers()->mutable_response());
        else r.mutable_request_headers();
        Send(std::move(r));
        return;
      case ep::ProcessingRequest::kRequestBody: {
        const auto& b = req_.request_body();
        if (duplex_) {
          body_ += b.body();
          if (!b.end_of_stream()) return;
          route(r.mutable_request_headers()->mutable_response());
          metadata(&r);
          Send(std::move(r));
          ep::ProcessingResponse body;
          auto* s = body.mutable_request_body()->mutable_response()->mutable_body_mutation()->mutable_streamed_response();
          s->set_body(body_);
          s->set_end_of_stream(true);
          Send(std::move(body));
          return;
        }
        route(r.mutable_request_body()->mutable_response());
        metadata(&r);
        Send(std::move(r));
        return;
      }
      case ep::ProcessingRequest::kResponseHeaders:
        r.mutable_response_headers();
        Send(std::move(r));
        return;
      case ep::ProcessingRequest::kResponseBody: {
        const auto& b = req_.response_body();
        if (duplex_) {
          auto* s = r.mutable_response_body()->mutable_response()->mutable_body_mutation()->mutable_streamed_response();
          s->set_body(b.body());
          s->set_end_of_stream(b.end_of_stream());
        } else {
          r.mutable_response_body();
        }
        Send(std::move(r));
        return;
      }
      case ep::ProcessingRequest::kRequestTrailers:
        r.mutable_request_trailers();
        Send(std::move(r));
        return;
      case ep::ProcessingRequest::kResponseTrailers:
        r.mutable_response_trailers();
        Send(std::move(r));
        return;
      default:
        return;
    }
  }

  ep::ProcessingRequest req_;
  std::mutex mu_;
  std::deque<ep::ProcessingResponse> out_;
  std::string body_;
  bool duplex_ = false, done_reading_ = false, finished_ = false;
};

class Service final : public ep::ExternalProcessor::CallbackService {
  ServerBidiReactor<ep::ProcessingRequest, ep::ProcessingResponse>* Process(CallbackServerContext*) override {
    return new Stream();
  }
};

int main(int argc, char** argv) {
  if (argc != 3) { std::cerr << "usage: floor ADDRESS ENDPOINT\n"; return 2; }
  g_endpoint = argv[2];
  grpc::EnableDefaultHealthCheckService(true);
  Service service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(argv[1], grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  server->GetHealthCheckService()->SetServingStatus("envoy.service.ext_proc.v3.ExternalProcessor", true);
  std::cerr << "serving on " << argv[1] << std::endl;
  server->Wait();
}
