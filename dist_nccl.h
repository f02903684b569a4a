/* dist_nccl.h — the CUDA backend's float32 collectives over NCCL (CUDA
 * builds only): one communicator per process group of the layout,
 * bootstrapped over MPI, on a communication stream of its own. */
#ifndef LLMTRAIN_DIST_NCCL_H
#define LLMTRAIN_DIST_NCCL_H
#include "parallel.h"

/* Create a communicator for every group (DIST_GROUP_*) with more than one
 * member (a group with the data-parallel group's members shares its
 * communicator), attach them to d (dist_attach_device: the float32
 * collectives on device memory then go through NCCL, the host ones stay on
 * MPI) and make the CUDA backend's host waits poll for NCCL errors. Needs
 * dist_setup_groups and kernels_cuda() (this rank's device chosen and set).
 * Collective over the world. An NCCL failure is one line naming the
 * collective, the group and NCCL's reason, then exit 6 (a peer or the
 * network failed) or 70. */
void dist_nccl_attach(Dist *d);

#endif
