// What every hyscale command shares: where the coordinator is, how to authenticate, how to print,
// and how an error becomes a message and an exit code.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <ostream>
#include <string>

#include "client/exit_codes.h"
#include "hyscale/v1/job.pb.h"
#include "hyscale/v1/service.grpc.pb.h"
#include "proto/rpc.h"

namespace hyscale::cli {

enum class OutputFormat { kTable, kJson };

struct Context {
  rpc::ClientOptions client;  // server, token, TLS, unary deadline (--timeout)
  OutputFormat output = OutputFormat::kTable;
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  bool terminal = false;  // `out` is a terminal: progress bars redraw in place
  int terminal_columns = 100;

  bool json() const { return output == OutputFormat::kJson; }
};

// Prints "hyscale: <what>: <message>" to err and returns the status's exit code.
int Fail(const Context& context, const std::string& what, const absl::Status& status);
int Fail(const Context& context, const std::string& what, const grpc::Status& status);

// The message as protobuf JSON (proto field names, defaults included): indented, or on one line
// for streams (one JSON document per line).
void PrintJson(const Context& context, const google::protobuf::Message& message,
               bool one_line = false);

absl::StatusOr<std::unique_ptr<v1::JobService::Stub>> JobStub(const Context& context);
absl::StatusOr<std::unique_ptr<v1::WorkerService::Stub>> WorkerStub(const Context& context);

// A unary method of a service's stub, e.g. &v1::JobService::Stub::GetJob.
template <typename Stub, typename Request, typename Response>
using UnaryMethod = grpc::Status (Stub::*)(grpc::ClientContext*, const Request&, Response*);

// One call of `method` with the context's deadline and token.
template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> CallUnary(const Context& context, Stub& stub,
                                   UnaryMethod<Stub, Request, Response> method,
                                   const Request& request) {
  Response response;
  grpc::ClientContext call;
  rpc::PrepareCall(&call, context.client);
  if (auto status = (stub.*method)(&call, request, &response); !status.ok()) {
    return rpc::FromGrpc(status);
  }
  return response;
}

// One call of a JobService method on a new connection to the coordinator.
template <typename Request, typename Response>
absl::StatusOr<Response> CallJobService(const Context& context,
                                        UnaryMethod<v1::JobService::Stub, Request, Response> method,
                                        const Request& request) {
  auto stub = JobStub(context);
  if (!stub.ok()) return stub.status();
  return CallUnary(context, **stub, method, request);
}

// Every page of a list RPC (ListJobs, ListWorkers): `list` is called with `request` and each next
// page token, and the pages' items are appended into `all`.
template <typename Stub, typename Request, typename Response>
absl::Status ReadEveryPage(const Context& context, Stub& stub,
                           UnaryMethod<Stub, Request, Response> list, Request request,
                           Response* all) {
  do {
    auto page = CallUnary(context, stub, list, request);
    if (!page.ok()) return page.status();
    request.set_page_token(page->next_page_token());
    page->clear_next_page_token();
    all->MergeFrom(*page);
  } while (!request.page_token().empty());
  return absl::OkStatus();
}

// Reads, then validates a job spec file (as it will run, with defaults), so a bad spec fails
// here with the field named rather than after a round trip.
absl::StatusOr<v1::JobSpec> LoadValidSpec(const std::string& path);

// A random RFC 4122 version 4 UUID, the default idempotency key of `submit`.
std::string RandomRequestId();

}  // namespace hyscale::cli
