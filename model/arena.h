// Carving one contiguous allocation into named activation tensors. Layout code runs twice: first on an
// empty arena that only counts, then on the real allocation, so sizes are written down in exactly one place.
#pragma once
#include <cstdint>
#include <vector>

template <typename T>
struct Arena {
    T* base = nullptr;  // nullptr while counting
    int64_t used = 0;
    T* take(int64_t n) {
        T* p = base ? base + used : nullptr;
        used += n;
        return p;
    }
};

// Runs carve(arena) to count, allocates storage, then runs it again to hand out pointers.
template <typename T, typename Carve>
void carve_arena(std::vector<T>& storage, Carve carve) {
    Arena<T> counting;
    carve(counting);
    storage.assign(counting.used, T(0));
    Arena<T> real{storage.data(), 0};
    carve(real);
}
