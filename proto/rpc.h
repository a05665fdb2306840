// What every gRPC client and server of HyScale shares: the bearer token, TLS, deadlines and the
// mapping between absl::Status and grpc::Status.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

namespace hyscale::rpc {

// Metadata key of the bearer token ("authorization: Bearer <token>").
inline constexpr char kAuthorizationHeader[] = "authorization";

// The token from `--token`-style text, else from the file `token_file`, else from the environment
// variable `env_name`; empty when none is given. A token file's surrounding whitespace is dropped.
absl::StatusOr<std::string> ResolveToken(const std::string& token, const std::string& token_file,
                                         const char* env_name);

// Reads a whole file (certificates, keys, tokens). Errors name the path.
absl::StatusOr<std::string> ReadFile(const std::string& path);

struct ClientOptions {
  std::string server;                        // host:port
  std::string token;                         // empty: no authorization header
  std::string tls_ca_file;                   // PEM roots; empty: plaintext
  std::chrono::milliseconds timeout{10000};  // deadline of each unary call
};

// A channel to `options.server`, TLS when a CA file is given.
absl::StatusOr<std::shared_ptr<grpc::Channel>> Connect(const ClientOptions& options);

// Sets the deadline (now + timeout; none when `timeout` is zero, for follow streams) and the
// bearer token on a call's context.
void PrepareCall(grpc::ClientContext* context, const ClientOptions& options,
                 std::chrono::milliseconds timeout);
inline void PrepareCall(grpc::ClientContext* context, const ClientOptions& options) {
  PrepareCall(context, options, options.timeout);
}

// Server credentials: TLS with `cert_file` and `key_file` when both are given, else insecure.
// One given without the other is an error naming the missing one.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const std::string& cert_file, const std::string& key_file);

// Constant-time comparison, so a token does not leak through response timing (also used by
// hyscaled's web view, server/web_ui.h).
bool SameSecret(const std::string& a, const std::string& b);

// The bearer tokens a server accepts: `full` on every call, `read` (when set) on reads only.
// Without a `full` token auth is off.
struct ServerTokens {
  std::string full;
  std::string read;
};
enum class Access { kRead, kWrite };

// Whether an Authorization header value ("Bearer <token>") grants `access`.
bool Authorized(const std::string& authorization, const ServerTokens& tokens, Access access);

// Checks the "authorization" metadata of a server call: UNAUTHENTICATED when it does not grant
// `access`.
grpc::Status CheckToken(const grpc::ServerContextBase& context, const ServerTokens& tokens,
                        Access access);

grpc::Status ToGrpc(const absl::Status& status);
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace hyscale::rpc
