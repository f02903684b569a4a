/* the host emulation of CUDA: see tests/cuda_emu/emu.h (bf16 is there) */
#include "../emu.h"
