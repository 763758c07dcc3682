// The same floor as floor.cc on gRPC C++'s completion-queue API with one thread: every stream's reads and
// writes are completed and answered by the thread that polls the queue (no hand-off between threads).
#include <deque>
#include <iostream>
#include <memory>
#include <string>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include "envoy/service/ext_proc/v3/external_processor.grpc.pb.h"

namespace ep = envoy::service::ext_proc::v3;
using Mode = envoy::extensions::filters::http::ext_proc::v3::ProcessingMode;

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

class Stream {
 public:
  enum class Op { kAccepted, kRead, kWrite, kFinished };
  struct Tag { Stream* stream; Op op; };

  Stream(ep::ExternalProcessor::AsyncService* service, grpc::ServerCompletionQueue* cq)
      : service_(service), cq_(cq), io_(&ctx_) {
    service_->RequestProcess(&ctx_, &io_, cq_, cq_, &accepted_);
  }

  void On(Op op, bool ok) {
    switch (op) {
      case Op::kAccepted:
        new Stream(service_, cq_);  // the next stream's slot
        if (!ok) { delete this; return; }
        io_.Read(&req_, &read_);
        return;
      case Op::kRead:
        if (!ok) { reading_ = false; MaybeFinish(); return; }
        Handle();
        io_.Read(&req_, &read_);
        return;
      case Op::kWrite:
        writing_ = false;
        out_.pop_front();
        if (!ok) { out_.clear(); }
        Flush();
        MaybeFinish();
        return;
      case Op::kFinished:
        delete this;
        return;
    }
  }

 private:
  void Send(ep::ProcessingResponse&& r) { out_.push_back(std::move(r)); Flush(); }
  void Flush() {
    if (writing_ || out_.empty()) return;
    writing_ = true;
    io_.Write(out_.front(), &write_);
  }
  void MaybeFinish() {
    if (reading_ || writing_ || !out_.empty() || finishing_) return;
    finishing_ = true;
    io_.Finish(grpc::Status::OK, &finished_);
  }
  void Handle() {
    ep::ProcessingResponse r;
    switch (req_.request_case()) {
      case ep::ProcessingRequest::kRequestHeaders:
        duplex_ = req_.has_protocol_config() && req_.protocol_config().request_body_mode() == Mode::FULL_DUPLEX_STREAMED;
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

  ep::ExternalProcessor::AsyncService* service_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<ep::ProcessingResponse, ep::ProcessingRequest> io_;
  Tag accepted_{this, Op::kAccepted}, read_{this, Op::kRead}, write_{this, Op::kWrite}, finished_{this, Op::kFinished};
  ep::ProcessingRequest req_;
  std::deque<ep::ProcessingResponse> out_;
  std::string body_;
  bool duplex_ = false, reading_ = true, writing_ = false, finishing_ = false;
};

int main(int argc, char** argv) {
  if (argc != 3) { std::cerr << "usage: floor_cq ADDRESS ENDPOINT\n"; return 2; }
  g_endpoint = argv[2];
  grpc::EnableDefaultHealthCheckService(true);
  ep::ExternalProcessor::AsyncService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(argv[1], grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  auto cq = builder.AddCompletionQueue();
  auto server = builder.BuildAndStart();
  server->GetHealthCheckService()->SetServingStatus("envoy.service.ext_proc.v3.ExternalProcessor", true);
  new Stream(&service, cq.get());
  void* tag;
  bool ok;
  while (cq->Next(&tag, &ok)) {
    auto* t = static_cast<Stream::Tag*>(tag);
    t->stream->On(t->op, ok);
  }
}
