/* the host emulation of CUB's DeviceRadixSort::SortKeys (tests/cuda_emu/emu.h):
 * a stable sort over bits [begin_bit, end_bit) of the keys into the other
 * buffer, which becomes Current(); temp storage is asked for and checked as
 * the real one does (NULL: report the bytes needed). */
#pragma once
#include "../../../emu.h"
#include <algorithm>
#include <vector>

namespace cub {
template <typename K> struct DoubleBuffer {
    K *d_buffers[2];
    int selector;
    DoubleBuffer() : d_buffers{nullptr, nullptr}, selector(0) {}
    DoubleBuffer(K *cur, K *alt) : d_buffers{cur, alt}, selector(0) {}
    K *Current() { return d_buffers[selector]; }
    K *Alternate() { return d_buffers[selector ^ 1]; }
};

struct DeviceRadixSort {
    template <typename K>
    static cudaError_t SortKeys(void *temp, size_t &temp_bytes, DoubleBuffer<K> &keys, int n, int begin_bit = 0,
                                int end_bit = (int)sizeof(K) * 8, cudaStream_t s = 0) {
        (void)s;
        size_t need = (size_t)(n > 0 ? n : 0) * 4 + 512;
        if (!temp) {
            temp_bytes = need;
            return cudaSuccess;
        }
        if (temp_bytes < need || begin_bit < 0 || end_bit > (int)sizeof(K) * 8 || begin_bit > end_bit || n < 0)
            return cudaErrorInvalidValue;
        const int bits = end_bit - begin_bit;
        const K mask = bits >= (int)sizeof(K) * 8 ? (K)~(K)0 : (K)(((K)1 << bits) - 1);
        std::vector<K> v(keys.Current(), keys.Current() + n);
        std::stable_sort(v.begin(), v.end(),
                         [&](K a, K b) { return ((a >> begin_bit) & mask) < ((b >> begin_bit) & mask); });
        std::copy(v.begin(), v.end(), keys.Alternate());
        keys.selector ^= 1;
        return cudaSuccess;
    }
};
} // namespace cub
