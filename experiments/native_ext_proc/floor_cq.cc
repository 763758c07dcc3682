// The same floor as floor.cc on gRPC C++'s completion-queue API with one thread: every stream's reads and
// writes are completed and answered by the thread that polls the queue (no hand-off between threads).
#include <deque>
#include <iostream>
#include <string>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "answers.h"

namespace ep = envoy::service::ext_proc::v3;

static std::string g_endpoint;

class Stream {
 public:
  enum class Op { kAccepted, kRead, kWrite, kFinished };
  struct Tag {
    Stream* stream;
    Op op;
  };

  Stream(ep::ExternalProcessor::AsyncService* service, grpc::ServerCompletionQueue* cq)
      : service_(service), cq_(cq), io_(&ctx_) {
    service_->RequestProcess(&ctx_, &io_, cq_, cq_, &accepted_);
  }

  void On(Op op, bool ok) {
    switch (op) {
      case Op::kAccepted:
        new Stream(service_, cq_);  // the next stream's slot
        if (!ok) {
          delete this;
          return;
        }
        io_.Read(&req_, &read_);
        return;
      case Op::kRead:
        if (!ok) {
          reading_ = false;
          MaybeFinish();
          return;
        }
        floor_answers::Answer(req_, state_, g_endpoint, [this](ep::ProcessingResponse&& r) {
          out_.push_back(std::move(r));
          Flush();
        });
        io_.Read(&req_, &read_);
        return;
      case Op::kWrite:
        writing_ = false;
        out_.pop_front();
        if (!ok) out_.clear();
        Flush();
        MaybeFinish();
        return;
      case Op::kFinished:
        delete this;
        return;
    }
  }

 private:
  void Flush() {  // one write in flight at a time
    if (writing_ || out_.empty()) return;
    writing_ = true;
    io_.Write(out_.front(), &write_);
  }

  void MaybeFinish() {
    if (reading_ || writing_ || !out_.empty() || finishing_) return;
    finishing_ = true;
    io_.Finish(grpc::Status::OK, &finished_);
  }

  ep::ExternalProcessor::AsyncService* service_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<ep::ProcessingResponse, ep::ProcessingRequest> io_;
  Tag accepted_{this, Op::kAccepted}, read_{this, Op::kRead}, write_{this, Op::kWrite}, finished_{this, Op::kFinished};
  ep::ProcessingRequest req_;
  floor_answers::Stream state_;
  std::deque<ep::ProcessingResponse> out_;
  bool reading_ = true, writing_ = false, finishing_ = false;
};

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: floor_cq ADDRESS ENDPOINT\n";
    return 2;
  }
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
