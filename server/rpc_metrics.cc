#include "server/rpc_metrics.h"

#include <google/protobuf/descriptor.h>

#include <chrono>
#include <string>

namespace hyscale::server {
namespace {

class RpcMetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(grpc::experimental::ServerRpcInfo* info, ServerMetrics* metrics)
      : method_(Method(info->method())), metrics_(metrics) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      metrics_->Rpc(method_, StatusCodeName(methods->GetSendStatus().error_code()), seconds);
    }
    methods->Proceed();
  }

 private:
  // "/hyscale.v1.JobService/SubmitJob" -> "hyscale.v1.JobService/SubmitJob" for a method this
  // binary knows (compiled-in protos, and gRPC's health service, which is not built on them);
  // "other" for anything else a client makes up: each name would be a new series.
  static std::string Method(const char* path) {
    std::string method = path == nullptr ? "" : path;
    if (!method.empty() && method[0] == '/') method.erase(0, 1);
    const size_t slash = method.find('/');
    if (slash == std::string::npos) return "other";
    const std::string full_name = method.substr(0, slash) + "." + method.substr(slash + 1);
    const bool known =
        google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(full_name) !=
            nullptr ||
        method == "grpc.health.v1.Health/Check" || method == "grpc.health.v1.Health/Watch";
    return known ? method : "other";
  }

  const std::string method_;
  ServerMetrics* const metrics_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

class RpcMetricsFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsFactory(ServerMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(info, metrics_);
  }

 private:
  ServerMetrics* const metrics_;
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
RpcMetricsInterceptors(ServerMetrics* metrics) {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<RpcMetricsFactory>(metrics));
  return factories;
}

const char* StatusCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

}  // namespace hyscale::server
