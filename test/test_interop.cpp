// The user's view of interoperability, through the real train_cpu: Hugging Face export and import, evaluation of a
// checkpoint or an export, sampling without training, plots at the end of a run, and llm.c's GPT-2 shards.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "data/shards.h"
#include "model/rng.h"
#include "test/test_helpers.h"

namespace {

std::string run_output(const std::string& cmd, int* status) {
    const std::string out = test_path("interop_out.txt");
    *status = system((cmd + " > " + out + " 2>&1").c_str());
    std::ifstream f(out);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

double value_after(const std::string& text, const std::string& key) {
    size_t at = text.rfind(key);
    return at == std::string::npos ? NAN : atof(text.c_str() + at + key.size());
}

bool exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && st.st_size > 0;
}

const std::string DATA = " --data 'data/default/train_*.bin' --val 'data/default/val_*.bin' --seq 32 --batch 4";
const std::string CONFIG = " --config test/data/ep-tiny.json";

}  // namespace

TEST_CASE("interop: a checkpoint, its F32 export and the re-import evaluate to the same validation loss") {
    const std::string dir = test_path("interop");
    system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
    int status = 0;
    std::string out = run_output("./train_cpu" + CONFIG + DATA + " --steps 5 --lr 1e-2 --checkpoint-dir " + dir + "/ckpt "
                                 "--export-hf " + dir + "/hf --export-dtype f32 --log " + dir + "/log.jsonl "
                                 "--plot " + dir + "/plot.png", &status);
    REQUIRE_MESSAGE(status == 0, out);
    CHECK(exists(dir + "/hf/config.json"));
    CHECK(exists(dir + "/hf/model.safetensors"));
    CHECK(exists(dir + "/plot.png"));
    REQUIRE(system(("./plot --log " + dir + "/log.jsonl --out " + dir + "/plot_again.png > /dev/null").c_str()) == 0);
    CHECK(read_file(dir + "/plot.png") == read_file(dir + "/plot_again.png"));  // --plot is ./plot on the log
    const double trained = value_after(out, "| val ");

    out = run_output("./train_cpu --resume --checkpoint-dir " + dir + "/ckpt --eval-only" + DATA, &status);
    REQUIRE_MESSAGE(status == 0, out);
    const double from_checkpoint = value_after(out, "val_loss ");
    out = run_output("./train_cpu --init-from-hf " + dir + "/hf --eval-only" + DATA, &status);
    REQUIRE_MESSAGE(status == 0, out);
    const double from_export = value_after(out, "val_loss ");
    MESSAGE("validation loss: end of training " << trained << ", checkpoint " << from_checkpoint << ", export " << from_export);
    CHECK(from_checkpoint == doctest::Approx(trained).epsilon(1e-5));  // printed with 4 decimals at the end of training
    CHECK(from_export == from_checkpoint);                             // F32 export: the same weights, bit for bit

    // a BF16 export evaluates within BF16 rounding of the weights (relative 2^-9 per weight; the loss moves far less)
    // (and --plot-log-scale is ./plot --log-scale on the log, which a resume at the last step leaves as it is)
    out = run_output("./train_cpu --resume --checkpoint-dir " + dir + "/ckpt --steps 5 --export-hf " + dir +
                     "/hf16 --log " + dir + "/log.jsonl --plot " + dir + "/plot_log.png --plot-log-scale" + DATA,
                     &status);
    REQUIRE_MESSAGE(status == 0, out);
    REQUIRE(system(("./plot --log " + dir + "/log.jsonl --out " + dir + "/plot_log_again.png --log-scale > /dev/null")
                       .c_str()) == 0);
    CHECK(read_file(dir + "/plot_log.png") == read_file(dir + "/plot_log_again.png"));
    CHECK(read_file(dir + "/plot_log.png") != read_file(dir + "/plot.png"));
    out = run_output("./train_cpu --init-from-hf " + dir + "/hf16 --eval-only" + DATA, &status);
    REQUIRE_MESSAGE(status == 0, out);
    CHECK(value_after(out, "val_loss ") == doctest::Approx(from_checkpoint).epsilon(1e-2));

    // sampling from the export without training, with temperature and top-k
    out = run_output("./train_cpu --init-from-hf " + dir + "/hf --steps 0 --sample 20 --top-k 5 --temperature 0.8 "
                     "--prompt 'The Licensor' --tokenizer data/default/tokenizer.bin --seq 32", &status);
    REQUIRE_MESSAGE(status == 0, out);
    CHECK(out.find("sample (temperature 0.80, top-k 5):\nThe Licensor") != std::string::npos);
    system(("rm -rf " + dir).c_str());
}

TEST_CASE("interop: llm.c GPT-2 shards (uint16, vocab 50257) train as they are with --vocab 50257") {
    const std::string dir = test_path("gpt2");
    system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
    Rng rng(3);
    std::vector<uint32_t> tokens(20000);
    for (uint32_t& t : tokens) t = (uint32_t)(rng.next_u64() % 50257);
    tokens[17] = 50256;  // <|endoftext|>, the largest GPT-2 token
    write_shard(dir + "/fineweb_train_000001.bin", tokens, 1);
    int status = 0;
    std::string out = run_output("./train_cpu --config tiny --data '" + dir + "/fineweb_train_*.bin' --steps 2 --batch 2 "
                                 "--seq 64", &status);
    CHECK(status != 0);
    CHECK(out.find("--vocab N overrides it") != std::string::npos);
    out = run_output("./train_cpu --config tiny --vocab 50257 --data '" + dir + "/fineweb_train_*.bin' --steps 2 "
                     "--batch 2 --seq 64", &status);
    CHECK_MESSAGE(status == 0, out);
    CHECK(out.find("step     2/2") != std::string::npos);
    // a fresh model predicts about uniformly: ln 50257 = 10.82
    CHECK(value_after(out, "(main ") == doctest::Approx(10.82).epsilon(0.02));
    system(("rm -rf " + dir).c_str());
}

TEST_CASE("interop: flags that cannot work together are one-line errors") {
    int status = 0;
    std::string out = run_output("./train_cpu --eval-only --resume --checkpoint-dir /tmp/x", &status);
    CHECK(status != 0);
    CHECK(out.find("--eval-only needs --val") != std::string::npos);
    out = run_output("./train_cpu --plot a.png --data x", &status);
    CHECK(status != 0);
    CHECK(out.find("--plot needs --log") != std::string::npos);
    out = run_output("./train_cpu --eval-only --resume --checkpoint-dir " + test_path("no_such_dir") +
                         " --val 'data/default/val_*.bin'",
                     &status);
    CHECK(status != 0);
    CHECK(out.find("no checkpoint in " + test_path("no_such_dir")) != std::string::npos);
    out = run_output("./train_cpu --checkpoint-every 5 --data x", &status);
    CHECK(status != 0);
    CHECK(out.find("--checkpoint-every needs --checkpoint-dir") != std::string::npos);
    out = run_output("./train_cpu --keep-checkpoints 2 --data x", &status);
    CHECK(status != 0);
    CHECK(out.find("--keep-checkpoints needs --checkpoint-dir") != std::string::npos);
    out = run_output("./train_cpu --init-from-hf /nonexistent --eval-only --val 'data/default/val_*.bin'", &status);
    CHECK(status != 0);
    CHECK(out.find("/nonexistent") != std::string::npos);
}

TEST_CASE("interop: prepare_data reads a directory (skipping symbolic links) and JSON lines") {
    const std::string dir = test_path("prep");
    system(("rm -rf " + dir + " && mkdir -p " + dir + "/texts/sub").c_str());
    std::string doc_a, doc_b;
    for (int i = 0; i < 200; i++) doc_a += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
    for (int i = 0; i < 200; i++) doc_b += "lorem ipsum dolor sit amet, consectetur adipiscing elit " + std::to_string(i) + "\n";
    std::ofstream(dir + "/texts/a.txt") << doc_a;
    std::ofstream(dir + "/texts/sub/b.txt") << doc_b;
    REQUIRE(system(("ln -s a.txt " + dir + "/texts/alias.txt").c_str()) == 0);
    int status = 0;
    std::string out = run_output("./prepare_data --input " + dir + "/texts --out-dir " + dir + "/dir --vocab 300", &status);
    REQUIRE_MESSAGE(status == 0, out);
    CHECK(out.find("2 documents") != std::string::npos);  // a.txt and sub/b.txt; the link is not read twice
    CHECK(exists(dir + "/dir/train_000000.bin"));
    CHECK(exists(dir + "/dir/val_000000.bin"));

    std::string xs, ys;
    for (int i = 0; i < 1000; i++) { xs += "xx "; ys += "yyy "; }
    std::ofstream jsonl(dir + "/docs.jsonl");
    jsonl << "{\"text\": \"" << xs << "\", \"id\": 1}\n";
    jsonl << "{\"content\": \"another field\", \"text\": \"" << ys << "\"}\n";
    jsonl.close();
    out = run_output("./prepare_data --input " + dir + "/docs.jsonl --out-dir " + dir + "/json --vocab 260", &status);
    REQUIRE_MESSAGE(status == 0, out);
    CHECK(out.find("2 documents, 7000 bytes") != std::string::npos);  // the text fields alone: 3000 + 4000 bytes
    out = run_output("./prepare_data --input " + dir + "/docs.jsonl --text-field body --out-dir " + dir + "/j2", &status);
    CHECK(status != 0);
    CHECK(out.find("body") != std::string::npos);
    system(("rm -rf " + dir).c_str());
}

TEST_CASE("interop: prepare_data writes --shard-tokens shards, removes an earlier run's extra shards, and does not "
          "read its own output") {
    const std::string dir = test_path("shards");
    system(("rm -rf " + dir + " && mkdir -p " + dir + "/texts").c_str());
    std::string doc;
    for (int i = 0; i < 300; i++) doc += "a line of text, number " + std::to_string(i) + ", for the shards\n";
    std::ofstream(dir + "/texts/doc.txt") << doc;
    const std::string prepare = "./prepare_data --input " + dir + "/texts --vocab 300 --val-fraction 0.2 --out-dir ";
    int status = 0;
    std::string out = run_output(prepare + dir + "/one", &status);
    REQUIRE_MESSAGE(status == 0, out);
    out = run_output(prepare + dir + "/texts/out --shard-tokens 1000", &status);  // below the input directory
    REQUIRE_MESSAGE(status == 0, out);
    const std::vector<uint32_t> whole = read_shard(dir + "/one/train_000000.bin");
    std::vector<uint32_t> joined;
    const std::vector<std::string> shards = glob_files(dir + "/texts/out/train_*.bin");
    for (const std::string& shard : shards) {
        const std::vector<uint32_t> tokens = read_shard(shard);
        CHECK(tokens.size() <= 1000);
        joined.insert(joined.end(), tokens.begin(), tokens.end());
    }
    CHECK(shards.size() == (whole.size() + 999) / 1000);
    CHECK(joined == whole);
    CHECK(read_shard(dir + "/texts/out/val_000000.bin") == read_shard(dir + "/one/val_000000.bin"));
    // the second run reads the same single document (not the first run's shards and tokenizer), with fewer shards
    out = run_output(prepare + dir + "/texts/out --shard-tokens 3000", &status);
    REQUIRE_MESSAGE(status == 0, out);
    CHECK(out.find("1 documents") != std::string::npos);
    CHECK(glob_files(dir + "/texts/out/train_*.bin").size() == (whole.size() + 2999) / 3000);
    CHECK_THROWS(glob_files(dir + "/texts/out/*.new"));  // nothing left under a temporary name: no file matches

    // --tokenizer: the given one is used as it is (the same encoding as the run that trained it); --val-fraction 0
    // puts everything in train and removes the validation shard an earlier run left
    out = run_output(prepare + dir + "/one --tokenizer " + dir + "/one/tokenizer.bin --val-fraction 0", &status);
    REQUIRE_MESSAGE(status == 0, out);
    CHECK(out.find("(from " + dir + "/one/tokenizer.bin)") != std::string::npos);
    CHECK(!exists(dir + "/one/val_000000.bin"));
    const std::vector<uint32_t> everything = read_shard(dir + "/one/train_000000.bin");
    CHECK(everything.size() > whole.size());
    CHECK(std::equal(whole.begin(), whole.end() - 8, everything.begin()));  // the same text encoded the same way
    system(("rm -rf " + dir).c_str());
}
