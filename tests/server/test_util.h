// Shared by the coordinator and service tests: scratch directories, a valid tiny job spec and
// worker registrations.
#pragma once

#include <string>

#include "hyscale/v1/service.pb.h"

namespace hyscale::server::testing {

// A fresh, empty directory under $TMPDIR (mode 0700) named after the test; removed at exit.
std::string ScratchDir();

// A small valid spec (d_model 32, 1 layer, seq_len 64, 20 steps).
v1::JobSpec TinySpec();

v1::SubmitJobRequest SubmitRequest(int ranks = 1, int priority = 0, int max_restarts = 0);

// A worker with `gpus` GPUs of 80 GB.
v1::RegisterWorkerRequest WorkerRequest(const std::string& name, int gpus);

}  // namespace hyscale::server::testing
