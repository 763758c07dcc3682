// Envoy's ext_proc stream answered in native code with the least decision: the floor of a native picker.
//
// Every call goes to ENDPOINT (answers.h). What it costs a call is gRPC C++'s stream (its callback API) and
// protobuf: what a native ext_proc front would cost before any decision. Built by build.sh; run by
// experiments/picker_floor.py and experiments/epp_overhead.py with --native.
#include <deque>
#include <iostream>
#include <mutex>
#include <string>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "answers.h"

namespace ep = envoy::service::ext_proc::v3;

static std::string g_endpoint;

class Stream : public grpc::ServerBidiReactor<ep::ProcessingRequest, ep::ProcessingResponse> {
 public:
  Stream() { StartRead(&req_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      MaybeFinish();
      return;
    }
    floor_answers::Answer(req_, state_, g_endpoint, [this](ep::ProcessingResponse&& r) { Send(std::move(r)); });
    StartRead(&req_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    out_.pop_front();
    if (!ok) out_.clear();
    if (!out_.empty()) StartWrite(&out_.front());
    else if (done_reading_ && !finished_) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

  void OnDone() override { delete this; }

 private:
  void Send(ep::ProcessingResponse&& r) {  // one write in flight at a time: the rest wait their turn
    std::lock_guard<std::mutex> lock(mu_);
    out_.push_back(std::move(r));
    if (out_.size() == 1) StartWrite(&out_.front());
  }

  void MaybeFinish() {
    std::lock_guard<std::mutex> lock(mu_);
    done_reading_ = true;
    if (out_.empty() && !finished_) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

  ep::ProcessingRequest req_;
  floor_answers::Stream state_;
  std::mutex mu_;  // reads and writes complete on different threads
  std::deque<ep::ProcessingResponse> out_;
  bool done_reading_ = false, finished_ = false;
};

class Service final : public ep::ExternalProcessor::CallbackService {
  grpc::ServerBidiReactor<ep::ProcessingRequest, ep::ProcessingResponse>* Process(
      grpc::CallbackServerContext*) override {
    return new Stream();
  }
};

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: floor ADDRESS ENDPOINT\n";
    return 2;
  }
  g_endpoint = argv[2];
  grpc::EnableDefaultHealthCheckService(true);
  Service service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(argv[1], grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  server->GetHealthCheckService()->SetServingStatus("envoy.service.ext_proc.v3.ExternalProcessor", true);
  server->Wait();
}
