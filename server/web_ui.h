// The coordinator's web view of jobs: one page (server/web/, embedded in the binary) and the
// read-only JSON it polls, mounted on the metrics HTTP server.
//
//   GET /                      the page (job list; #job=ID shows a job)
//   GET /app.js                its script
//   GET /api/v1/jobs           {"jobs": [row...]}, newest first
//   GET /api/v1/job?id=ID&after=N
//                              {"job": row, "steps": [...], "states": [...], "after": M,
//                               "more": bool, "phase_order": [...]}: rank 0's steps and the state
//                               changes among the job's events with sequence > N (at most
//                               kEventsPerPoll of them), and the trainer's phases in step order
//
// Errors are JSON {"error": "..."}: 400 for a malformed parameter (named), 404 for an unknown
// job, 401 when a token is configured and the request does not carry it. With a token, the JSON
// needs `Authorization: Bearer TOKEN`, the same token as the gRPC API: the page takes it from
// the URL fragment (#token=...), which browsers never send to a server or put in a Referer, and
// keeps it in sessionStorage. The page and script hold no data and are served to anyone.
#pragma once

#include <string>

#include "proto/rpc.h"
#include "server/coordinator.h"
#include "server/metrics_http.h"

namespace hyscale::server {

class WebUi {
 public:
  static constexpr int kEventsPerPoll = 2000;

  // No full token serves the JSON to anyone (as the gRPC API does without one); else the full or
  // the read-only token is needed.
  WebUi(Coordinator* coordinator, rpc::ServerTokens tokens);

  // Mounts the routes above on `http` (before it starts).
  void Mount(MetricsHttpServer* http) const;

  HttpResponse Jobs(const HttpRequest& request) const;
  HttpResponse Job(const HttpRequest& request) const;

 private:
  Coordinator* const coordinator_;
  const rpc::ServerTokens tokens_;
};

}  // namespace hyscale::server
