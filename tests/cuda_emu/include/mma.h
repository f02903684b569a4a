/* the host emulation of CUDA: see tests/cuda_emu/emu.h (wmma is there) */
#include "../emu.h"
