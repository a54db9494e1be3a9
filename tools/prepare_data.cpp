// prepare_data: text to what the trainers read. Reads documents (text files, directories, .jsonl of JSON objects),
// splits each into train (its first 1-F bytes) and validation (the rest, from the next whitespace), trains a
// byte-level BPE tokenizer on the train text (or loads one), and writes DIR/tokenizer.bin and llm.c shards
// DIR/train_000000.bin, ... and DIR/val_000000.bin, ... Each file is written under a temporary name and renamed
// once all are written, so a failed run leaves the previous outputs; an earlier run's extra shards are removed.
#include "data/shards.h"
#include "data/tokenizer.h"
#include "model/config.h"
#include "io/files.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

static const char* USAGE =
    "usage: ./prepare_data --input PATH [--input PATH ...] --out-dir DIR [options]\n"
    "  --input PATH        a text file (one document), a .jsonl file (one JSON object per line), or a directory\n"
    "                      (every regular file below it, sorted by path; symbolic links are skipped)\n"
    "  --out-dir DIR       writes DIR/tokenizer.bin, DIR/train_000000.bin, ..., DIR/val_000000.bin, ... (created if\n"
    "                      missing; files below it are not read as input)\n"
    "  --vocab N           tokenizer vocabulary size to train, >= 256 (default 1024)\n"
    "  --val-fraction F    the last F of each document's bytes goes to validation, 0 <= F < 1 (default 0.1;\n"
    "                      0 writes no validation shard)\n"
    "  --tokenizer FILE    use this tokenizer instead of training one\n"
    "  --text-field KEY    the .jsonl field holding the document text (default \"text\")\n"
    "  --shard-tokens N    tokens per shard, at most (default 100000000, as llm.c's)\n";

// A command-line mistake: exit status 2, as train_cpu's
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct Options {
    std::vector<std::string> inputs;
    std::string out_dir;
    int vocab = 1024;
    bool vocab_given = false;
    double val_fraction = 0.1;
    std::string tokenizer_path;
    std::string text_field = "text";
    int64_t shard_tokens = 100000000;
};

static Options parse_args(int argc, char** argv) {
    Options opt;
    for (int i = 1; i < argc; i++) {
        const std::string flag = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0)
                throw UsageError(flag + " needs a value");
            return argv[++i];
        };
        char* end = nullptr;
        if (flag == "--input") {
            opt.inputs.push_back(value());
        } else if (flag == "--out-dir") {
            opt.out_dir = value();
        } else if (flag == "--vocab") {
            const std::string v = value();
            const long n = strtol(v.c_str(), &end, 10);
            if (*end || v.empty() || n < 256 || n > MAX_VOCAB_SIZE)
                throw UsageError("--vocab must be an integer in [256, " + std::to_string(MAX_VOCAB_SIZE) + "], got '" +
                                 v + "'");
            opt.vocab = (int)n;
            opt.vocab_given = true;
        } else if (flag == "--val-fraction") {
            const std::string v = value();
            const double f = strtod(v.c_str(), &end);
            if (*end || v.empty() || !(f >= 0.0 && f < 1.0))
                throw UsageError("--val-fraction must be a number in [0, 1), got '" + v + "'");
            opt.val_fraction = f;
        } else if (flag == "--tokenizer") {
            opt.tokenizer_path = value();
        } else if (flag == "--text-field") {
            opt.text_field = value();
        } else if (flag == "--shard-tokens") {  // a shard's header counts its tokens in an int32
            const std::string v = value();
            const long long n = strtoll(v.c_str(), &end, 10);
            if (*end || v.empty() || n < 1 || n > INT32_MAX)
                throw UsageError("--shard-tokens must be an integer in [1, 2147483647], got '" + v + "'");
            opt.shard_tokens = n;
        } else {
            throw UsageError(flag.rfind("--", 0) == 0 ? "unknown flag " + flag + " (see --help)"
                                                      : "unexpected argument " + flag + " (see --help)");
        }
    }
    if (opt.inputs.empty()) throw UsageError("--input is required (see --help)");
    if (opt.out_dir.empty()) throw UsageError("--out-dir is required (see --help)");
    return opt;
}

// Appends the documents of one file: the whole file, or for .jsonl the string field of each non-blank line.
static void read_file_documents(const std::string& path, const std::string& text_field, std::vector<std::string>& docs) {
    std::string bytes = read_file(path);
    if (path.size() < 6 || path.compare(path.size() - 6, 6, ".jsonl") != 0) {
        docs.push_back(bytes);
        return;
    }
    std::istringstream lines(bytes);
    std::string line;
    for (int64_t line_number = 1; std::getline(lines, line); line_number++) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        nlohmann::json object;
        try {
            object = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {  // the reason (ill-formed UTF-8...), not the line's text
            std::string why = e.what();
            why = why.substr(why.find("] ") == std::string::npos ? 0 : why.find("] ") + 2);
            why = why.substr(0, why.find("; last read:"));
            if (why.size() > 200) why = why.substr(0, 200) + "...";
            for (char& ch : why) ch = std::isprint((unsigned char)ch) ? ch : '?';
            throw std::runtime_error(path + " line " + std::to_string(line_number) + ": not valid JSON (" + why + ")");
        }
        if (!object.is_object() || !object.contains(text_field) || !object[text_field].is_string())
            throw std::runtime_error(path + " line " + std::to_string(line_number) + ": no string field \"" + text_field + "\"");
        docs.push_back(object[text_field].get<std::string>());
    }
}

// Every document of an input; in a directory, not the files below out_dir (a second run would read the first's
// shards and tokenizer as text)
static void read_input_documents(const std::string& path, const std::string& text_field, const std::string& out_dir,
                                 std::vector<std::string>& docs) {
    if (!fs::exists(path)) throw std::runtime_error("input " + path + " does not exist");
    if (!fs::is_directory(path)) {
        if (fs::is_character_file(path) || fs::is_block_file(path))  // /dev/zero would never end (a pipe may)
            throw std::runtime_error("input " + path + " is a device, not a file");
        read_file_documents(path, text_field, docs);
        return;
    }
    const fs::path out = fs::weakly_canonical(out_dir);
    auto below_out = [&](const fs::path& file) {
        const fs::path canonical = fs::weakly_canonical(file);
        return std::mismatch(out.begin(), out.end(), canonical.begin(), canonical.end()).first == out.end();
    };
    std::vector<std::string> files;
    for (const auto& entry : fs::recursive_directory_iterator(path))
        if (!entry.is_symlink() && entry.is_regular_file() && !below_out(entry.path()))
            files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    for (const std::string& file : files) read_file_documents(file, text_field, docs);
}

static void append_document(std::string& text, const std::string& doc) {
    if (doc.empty()) return;
    if (!text.empty()) text += "\n\n";
    text += doc;
}

static void print_split(const char* name, size_t bytes, const std::vector<uint32_t>& tokens,
                        const std::vector<std::string>& paths) {
    printf("%s %zu bytes, %zu tokens, %.2f bytes/token -> %s%s\n", name, bytes, tokens.size(),
           tokens.empty() ? 0.0 : (double)bytes / (double)tokens.size(), paths[0].c_str(),
           paths.size() > 1 ? (" ... (" + std::to_string(paths.size()) + " shards)").c_str() : "");
}

// DIR/NAME_%06d.bin, the shard paths of one split
static std::string shard_path(const std::string& dir, const std::string& name, size_t index) {
    char file[64];
    snprintf(file, sizeof file, "/%s_%06zu.bin", name.c_str(), index);
    return dir + file;
}

// tokens in shards of at most shard_tokens (one shard when empty), each written to PATH.new; returns the PATHs
static std::vector<std::string> write_split(const std::string& dir, const std::string& name,
                                            const std::vector<uint32_t>& tokens, int64_t shard_tokens, int version) {
    std::vector<std::string> paths;
    for (size_t first = 0; first < tokens.size() || paths.empty(); first += (size_t)shard_tokens) {
        const size_t last = std::min(tokens.size(), first + (size_t)shard_tokens);
        paths.push_back(shard_path(dir, name, paths.size()));
        write_shard(paths.back() + ".new", std::vector<uint32_t>(tokens.begin() + first, tokens.begin() + last),
                    version);
    }
    return paths;
}

// Renames every PATH.new to PATH, after removing the split's shards that are not among them (an earlier run's)
static void publish(const std::string& dir, const std::string& name, const std::vector<std::string>& paths) {
    for (size_t index = paths.size(); fs::exists(shard_path(dir, name, index)); index++)
        fs::remove(shard_path(dir, name, index));
    for (const std::string& path : paths) fs::rename(path + ".new", path);
}

static void run(const Options& opt) {
    std::vector<std::string> docs;
    for (const std::string& input : opt.inputs) read_input_documents(input, opt.text_field, opt.out_dir, docs);
    std::string train_text, val_text;
    size_t total_bytes = 0;
    for (const std::string& doc : docs) {
        size_t val_start = doc.size() - (size_t)((double)doc.size() * opt.val_fraction);
        while (val_start < doc.size() && !std::isspace((unsigned char)doc[val_start])) val_start++;
        append_document(train_text, doc.substr(0, val_start));
        append_document(val_text, doc.substr(val_start));
        total_bytes += doc.size();
    }
    if (train_text.empty()) throw std::runtime_error("the inputs hold no text");
    if (opt.val_fraction > 0 && val_text.empty()) {
        char fraction[32];
        snprintf(fraction, sizeof fraction, "%g", opt.val_fraction);
        throw std::runtime_error(std::string("no validation text: the documents are too short for --val-fraction ") + fraction);
    }
    Tokenizer tok = opt.tokenizer_path.empty() ? Tokenizer::train(train_text, opt.vocab) : Tokenizer::load(opt.tokenizer_path);
    if (!opt.tokenizer_path.empty() && opt.vocab_given && opt.vocab != tok.vocab_size())
        throw std::runtime_error("--vocab " + std::to_string(opt.vocab) + " disagrees with " + opt.tokenizer_path +
                                 " (vocab " + std::to_string(tok.vocab_size()) + ")");
    int version = tok.vocab_size() <= 65536 ? 1 : 2;
    fs::create_directories(opt.out_dir);
    const std::string tokenizer_out = opt.out_dir + "/tokenizer.bin";
    tok.save(tokenizer_out + ".new");
    const std::vector<uint32_t> train_tokens = tok.encode(train_text);
    const std::vector<std::string> train_out =
        write_split(opt.out_dir, "train", train_tokens, opt.shard_tokens, version);
    std::vector<uint32_t> val_tokens;
    std::vector<std::string> val_out;
    if (opt.val_fraction > 0) {
        val_tokens = tok.encode(val_text);
        val_out = write_split(opt.out_dir, "val", val_tokens, opt.shard_tokens, version);
    }
    fs::rename(tokenizer_out + ".new", tokenizer_out);
    publish(opt.out_dir, "train", train_out);
    publish(opt.out_dir, "val", val_out);  // with --val-fraction 0: no stale validation shards
    printf("prepare_data: %zu documents, %zu bytes\n", docs.size(), total_bytes);
    std::string source = opt.tokenizer_path.empty() ? "trained" : "from " + opt.tokenizer_path;
    printf("tokenizer: vocab %d (%s) -> %s\n", tok.vocab_size(), source.c_str(), tokenizer_out.c_str());
    print_split("train:", train_text.size(), train_tokens, train_out);
    if (!val_out.empty()) {
        print_split("val:  ", val_text.size(), val_tokens, val_out);
        printf("val unigram entropy: %.4f nats\n", unigram_entropy_nats(val_tokens));
    }
}

int main(int argc, char** argv) {
    for (int i = 1; i < argc; i++)
        if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
            printf("%s", USAGE);
            return 0;
        }
    try {
        run(parse_args(argc, argv));
    } catch (const UsageError& e) {
        fprintf(stderr, "prepare_data: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        fprintf(stderr, "prepare_data: %s\n", e.what());
        return 1;
    }
    return 0;
}
