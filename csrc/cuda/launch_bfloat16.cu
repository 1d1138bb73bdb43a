// The bfloat16 launches of the CUDA backend and their kernels, in a translation unit of their own
// (see cuda_launcher.cuh).
#include "cuda_launcher.cuh"

FF_CUDA_LAUNCH_INSTANCES(template, at::BFloat16, float)
