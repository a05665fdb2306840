#include "proto/rpc.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace hyscale::rpc {
namespace {

std::string Trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

}  // namespace

bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(path + ": read failed");
  return text.str();
}

absl::StatusOr<std::string> ResolveToken(const std::string& token, const std::string& token_file,
                                         const char* env_name) {
  if (!token.empty()) return token;
  if (!token_file.empty()) {
    auto text = ReadFile(token_file);
    if (!text.ok()) return text.status();
    std::string trimmed = Trim(*text);
    if (trimmed.empty()) return absl::InvalidArgumentError(token_file + ": token file is empty");
    return trimmed;
  }
  if (env_name != nullptr) {
    if (const char* value = std::getenv(env_name); value != nullptr) return Trim(value);
  }
  return std::string();
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> Connect(const ClientOptions& options) {
  if (options.server.empty()) return absl::InvalidArgumentError("server: address is empty");
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.tls_ca_file.empty()) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    auto roots = ReadFile(options.tls_ca_file);
    if (!roots.ok()) return roots.status();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *roots;
    credentials = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments arguments;
  // Reconnect quickly after a coordinator restart instead of grpc's default of up to 2 minutes.
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  return grpc::CreateCustomChannel(options.server, credentials, arguments);
}

void PrepareCall(grpc::ClientContext* context, const ClientOptions& options,
                 std::chrono::milliseconds timeout) {
  if (timeout.count() > 0) context->set_deadline(std::chrono::system_clock::now() + timeout);
  if (!options.token.empty()) {
    context->AddMetadata(kAuthorizationHeader, "Bearer " + options.token);
  }
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() && key_file.empty()) return grpc::InsecureServerCredentials();
  if (cert_file.empty()) return absl::InvalidArgumentError("tls_cert: required with tls_key");
  if (key_file.empty()) return absl::InvalidArgumentError("tls_key: required with tls_cert");
  auto cert = ReadFile(cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadFile(key_file);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(ssl);
}

bool Authorized(const std::string& authorization, const ServerTokens& tokens, Access access) {
  if (tokens.full.empty()) return true;
  constexpr std::string_view kPrefix = "Bearer ";
  if (authorization.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  const std::string given = authorization.substr(kPrefix.size());
  // Both comparisons always run, so timing does not tell which token was close.
  const bool full = SameSecret(given, tokens.full);
  const bool read = !tokens.read.empty() && SameSecret(given, tokens.read);
  return full || (access == Access::kRead && read);
}

grpc::Status CheckToken(const grpc::ServerContextBase& context, const ServerTokens& tokens,
                        Access access) {
  if (tokens.full.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kAuthorizationHeader);
  if (found == metadata.end()) {
    return {grpc::StatusCode::UNAUTHENTICATED, "authorization: bearer token required"};
  }
  if (!Authorized(std::string(found->second.data(), found->second.size()), tokens, access)) {
    return {grpc::StatusCode::UNAUTHENTICATED,
            access == Access::kRead ? "authorization: wrong bearer token"
                                    : "authorization: wrong bearer token (or a read-only one)"};
  }
  return grpc::Status::OK;
}

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return {static_cast<grpc::StatusCode>(status.code()), std::string(status.message())};
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return {static_cast<absl::StatusCode>(status.error_code()), status.error_message()};
}

}  // namespace hyscale::rpc
