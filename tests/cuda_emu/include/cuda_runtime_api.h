/* the host emulation of CUDA: see tests/cuda_emu/emu.h */
#include "../emu.h"
