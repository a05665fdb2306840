#include "server/admission.h"

#include "server/request_limits.h"

namespace hyscale::server {

grpc::Status Admit(const grpc::ServerContextBase& context, const rpc::ServerTokens& tokens,
                   rpc::Access access, const google::protobuf::Message& request) {
  if (auto auth = rpc::CheckToken(context, tokens, access); !auth.ok()) return auth;
  return rpc::ToGrpc(CheckFieldSizes(request));
}

}  // namespace hyscale::server
