// Whole-file atomic writes and mkdir -p (see files.h).
#include "io/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

void write_file_atomic(const std::string& path, const std::function<bool(FILE*)>& fill) {
    const std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (!f) throw std::runtime_error("cannot write " + tmp + ": " + strerror(errno));
    bool ok = false;
    int err = 0;
    try {
        errno = 0;
        ok = fill(f) && fflush(f) == 0 && fsync(fileno(f)) == 0;
        err = ok ? 0 : errno;
    } catch (...) {
        fclose(f);
        remove(tmp.c_str());
        throw;
    }
    if (fclose(f) != 0 && ok) ok = false, err = errno;
    if (!ok) {
        remove(tmp.c_str());
        throw std::runtime_error("cannot write " + path + ": " + (err ? strerror(err) : "short write"));
    }
    rename_durably(tmp, path);
}

void rename_durably(const std::string& from, const std::string& path) {
    if (rename(from.c_str(), path.c_str()) != 0) {
        const int err = errno;
        remove(from.c_str());
        throw std::runtime_error("cannot write " + path + ": " + strerror(err));
    }
    // the rename itself lasts only once the directory is on disk (EINVAL: a file system that cannot sync one)
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL)) {
        const int err = errno;
        if (fd >= 0) close(fd);
        throw std::runtime_error("cannot write " + path + ": syncing " + dir + ": " + strerror(err));
    }
    close(fd);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
    write_file_atomic(path, [&](FILE* f) { return fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size(); });
}

void make_dirs(const std::string& dir) {
    for (size_t i = 1; i <= dir.size(); i++) {
        if (i < dir.size() && dir[i] != '/') continue;
        const std::string p = dir.substr(0, i);
        if (mkdir(p.c_str(), 0755) != 0 && errno != EEXIST)
            throw std::runtime_error("cannot create directory " + p + ": " + strerror(errno));
    }
    struct stat st;
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw std::runtime_error(dir + ": not a directory");
}
