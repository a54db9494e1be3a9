// MOE_HD marks inline functions that both compilers see: the CUDA kernels and the CPU reference share them.
#pragma once
#ifdef __CUDACC__
#define MOE_HD __host__ __device__
#else
#define MOE_HD
#endif
