#include "client/commands/commands.h"

namespace hyscale::cli {

int Logs(const Context& context, const LogsArgs& args) {
  auto stub = JobStub(context);
  if (!stub.ok()) return Fail(context, "logs", stub.status());
  grpc::ClientContext call;
  // Following lasts as long as the job: no deadline then.
  rpc::PrepareCall(&call, context.client,
                   args.follow ? std::chrono::milliseconds(0) : context.client.timeout);
  v1::StreamLogsRequest request;
  request.set_job_id(args.job_id);
  request.set_rank(args.rank);
  request.set_follow(args.follow);
  auto reader = (*stub)->StreamLogs(&call, request);
  v1::LogChunk chunk;
  while (reader->Read(&chunk)) {
    if (context.json()) {
      PrintJson(context, chunk, /*one_line=*/true);
    } else {
      context.out->write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
      context.out->flush();
    }
  }
  if (auto status = reader->Finish(); !status.ok()) return Fail(context, "logs", status);
  return kExitOk;
}

}  // namespace hyscale::cli
