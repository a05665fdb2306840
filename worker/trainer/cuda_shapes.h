// A job's head shapes against the ones the CUDA kernels are compiled for (kernels/cuda_shapes.h),
// checked before a GPU run starts rather than at the first kernel call (which, for the indexer,
// may be the evaluation after the last step).
#pragma once

#include <absl/status/status.h>

#include "hyscale/v1/job.pb.h"

namespace hyscale::trainer {

// The indexer's shape always (selection and evaluation run it on the GPU); the attention's head
// dims when the job attends sparsely (`sparse`: a SPARSE stage, or --attention sparse).
// InvalidArgument naming the fields and the shapes the kernels take.
absl::Status CheckCudaShapes(const v1::JobSpec& spec, bool sparse);

}  // namespace hyscale::trainer
