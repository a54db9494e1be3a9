// The arena (docs/design.md §10): one allocation carved into typed, 256-byte aligned parts, for the CPU's
// activations and every buffer of the GPU model. The layout code runs twice, first on an arena with no base, which
// only counts, then on the allocation, so each size is written in one place.
#pragma once
#include <cstdint>
#include <vector>

struct Arena {
    char* base = nullptr;  // nullptr while counting
    int64_t used = 0;      // bytes
    template <typename T>
    T* take(int64_t n) {
        if (n <= 0) return nullptr;
        used = (used + 255) / 256 * 256;
        T* p = base ? reinterpret_cast<T*>(base + used) : nullptr;
        used += n * (int64_t)sizeof(T);
        return p;
    }
};

// Runs carve(arena) to count, sizes storage (zeroed), then runs it again to hand out pointers.
template <typename Carve>
void carve_arena(std::vector<float>& storage, Carve carve) {
    Arena counting;
    carve(counting);
    storage.assign((counting.used + 3) / 4, 0.0f);
    Arena real{reinterpret_cast<char*>(storage.data()), 0};
    carve(real);
}
