// The file helpers everything that reads or writes whole files shares: a whole-file read, atomic writes (PATH.tmp,
// fsync, rename, fsync of the directory: PATH is either the old file or the complete new one, also after a crash)
// and mkdir -p. Every failure throws std::runtime_error with one line naming the file and the reason.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

// The whole file, of at most max_bytes; throws "cannot open PATH: reason", "cannot read PATH: reason" or "PATH is
// larger than N bytes" (a device like /dev/zero, or the wrong file).
inline std::string read_file(const std::string& path, size_t max_bytes = SIZE_MAX) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) throw std::runtime_error("cannot open " + path + ": " + strerror(errno));
    std::string out;
    char buf[1 << 16];
    for (size_t n; out.size() <= max_bytes && (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    const bool bad = ferror(f);
    const int err = errno;
    fclose(f);
    if (bad) throw std::runtime_error("cannot read " + path + ": " + strerror(err));
    if (out.size() > max_bytes)
        throw std::runtime_error(path + " is larger than " + std::to_string(max_bytes) + " bytes");
    return out;
}

// Writes PATH.tmp through fill (false: a write failed), then fflush + fsync, rename to PATH, fsync of PATH's
// directory. On failure the .tmp is removed and PATH is left as it was; throws "cannot write PATH.tmp: reason"
// (cannot create it) or "cannot write PATH: reason".
void write_file_atomic(const std::string& path, const std::function<bool(FILE*)>& fill);
void write_file_atomic(const std::string& path, const std::string& bytes);
// The last step of an atomic write: renames the complete file `from` to PATH and syncs PATH's directory. On failure
// `from` is removed; throws "cannot write PATH: reason".
void rename_durably(const std::string& from, const std::string& path);

// mkdir -p: creates dir and its parents; throws naming the part that cannot be created.
void make_dirs(const std::string& dir);
