// prepare_data: turns text into what the trainers read. Reads documents (text files, directories of files,
// .jsonl with one JSON object per line), splits each document into train (the first 1-F of its bytes) and
// validation (the rest, from the next whitespace), trains a byte-level BPE tokenizer on the train text (or
// loads one), and writes DIR/tokenizer.bin, DIR/train_000000.bin and DIR/val_000000.bin as llm.c shards.
#include "data/shards.h"
#include "data/tokenizer.h"
#include "model/files.h"

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
    "  --out-dir DIR       writes DIR/tokenizer.bin, DIR/train_000000.bin, DIR/val_000000.bin (created if missing)\n"
    "  --vocab N           tokenizer vocabulary size to train, >= 256 (default 1024)\n"
    "  --val-fraction F    the last F of each document's bytes goes to validation, 0 <= F < 1 (default 0.1;\n"
    "                      0 writes no validation shard)\n"
    "  --tokenizer FILE    use this tokenizer instead of training one\n"
    "  --text-field KEY    the .jsonl field holding the document text (default \"text\")\n";

struct Options {
    std::vector<std::string> inputs;
    std::string out_dir;
    int vocab = 1024;
    bool vocab_given = false;
    double val_fraction = 0.1;
    std::string tokenizer_path;
    std::string text_field = "text";
};

static Options parse_args(int argc, char** argv) {
    Options opt;
    for (int i = 1; i < argc; i++) {
        std::string flag = argv[i];
        if (i + 1 >= argc) throw std::runtime_error(flag.rfind("--", 0) == 0 ? flag + " needs a value" : "unexpected argument " + flag);
        std::string value = argv[++i];
        char* end = nullptr;
        if (flag == "--input") {
            opt.inputs.push_back(value);
        } else if (flag == "--out-dir") {
            opt.out_dir = value;
        } else if (flag == "--vocab") {
            long v = strtol(value.c_str(), &end, 10);
            if (*end || value.empty() || v < 256 || v > (1L << 24)) throw std::runtime_error("--vocab must be an integer in [256, 16777216], got '" + value + "'");
            opt.vocab = (int)v;
            opt.vocab_given = true;
        } else if (flag == "--val-fraction") {
            double f = strtod(value.c_str(), &end);
            if (*end || value.empty() || !(f >= 0.0 && f < 1.0)) throw std::runtime_error("--val-fraction must be a number in [0, 1), got '" + value + "'");
            opt.val_fraction = f;
        } else if (flag == "--tokenizer") {
            opt.tokenizer_path = value;
        } else if (flag == "--text-field") {
            opt.text_field = value;
        } else {
            throw std::runtime_error("unknown flag " + flag + " (see --help)");
        }
    }
    if (opt.inputs.empty()) throw std::runtime_error("--input is required (see --help)");
    if (opt.out_dir.empty()) throw std::runtime_error("--out-dir is required (see --help)");
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
        } catch (const nlohmann::json::parse_error&) {
            throw std::runtime_error(path + " line " + std::to_string(line_number) + ": not valid JSON");
        }
        if (!object.is_object() || !object.contains(text_field) || !object[text_field].is_string())
            throw std::runtime_error(path + " line " + std::to_string(line_number) + ": no string field \"" + text_field + "\"");
        docs.push_back(object[text_field].get<std::string>());
    }
}

static void read_input_documents(const std::string& path, const std::string& text_field, std::vector<std::string>& docs) {
    if (!fs::exists(path)) throw std::runtime_error("input " + path + " does not exist");
    if (!fs::is_directory(path)) {
        read_file_documents(path, text_field, docs);
        return;
    }
    std::vector<std::string> files;
    for (const auto& entry : fs::recursive_directory_iterator(path))
        if (!entry.is_symlink() && entry.is_regular_file()) files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    for (const std::string& file : files) read_file_documents(file, text_field, docs);
}

static void append_document(std::string& text, const std::string& doc) {
    if (doc.empty()) return;
    if (!text.empty()) text += "\n\n";
    text += doc;
}

static void print_split(const char* name, size_t bytes, const std::vector<uint32_t>& tokens, const std::string& path) {
    printf("%s %zu bytes, %zu tokens, %.2f bytes/token -> %s\n", name, bytes, tokens.size(),
           tokens.empty() ? 0.0 : (double)bytes / (double)tokens.size(), path.c_str());
}

static void run(const Options& opt) {
    std::vector<std::string> docs;
    for (const std::string& input : opt.inputs) read_input_documents(input, opt.text_field, docs);
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
    std::string tokenizer_out = opt.out_dir + "/tokenizer.bin";
    tok.save(tokenizer_out);
    std::vector<uint32_t> train_tokens = tok.encode(train_text);
    std::string train_out = opt.out_dir + "/train_000000.bin";
    write_shard(train_out, train_tokens, version);

    printf("prepare_data: %zu documents, %zu bytes\n", docs.size(), total_bytes);
    std::string source = opt.tokenizer_path.empty() ? "trained" : "from " + opt.tokenizer_path;
    printf("tokenizer: vocab %d (%s) -> %s\n", tok.vocab_size(), source.c_str(), tokenizer_out.c_str());
    print_split("train:", train_text.size(), train_tokens, train_out);
    std::string val_out = opt.out_dir + "/val_000000.bin";
    if (opt.val_fraction == 0) {
        fs::remove(val_out);  // no stale validation shard from an earlier run
    } else {
        std::vector<uint32_t> val_tokens = tok.encode(val_text);
        write_shard(val_out, val_tokens, version);
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
    } catch (const std::exception& e) {
        fprintf(stderr, "prepare_data: %s\n", e.what());
        return 1;
    }
    return 0;
}
