// --recompute (activation checkpointing) on the CPU: the model keeps the residual stream, one activation set per
// kind of block and one chunk of logits per output head; each block whose set another block has overwritten runs its
// forward again before its backward, and each head chunk is computed again. The recomputations read the same inputs
// through the same code, so everything must be the same bits as without: the losses, every gradient and the expert
// counts of the model (FP32 and FP8, dense and MoE blocks, MTP, heads in one chunk or several), the logits of a
// sampling forward, and the checkpoint train_cpu writes after a few steps, on one rank and on two (EP 2: the
// recomputed forwards exchange their rows again). The heads in chunks against one chunk: the same losses and
// gradients up to the order of the head's weight-gradient sums. The GPU model has the same checks in
// test/gpu_model_check.cpp.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "model/fp8.h"
#include "test/test_helpers.h"

namespace {

// Two micro-batches of forward and backward; the loss parts of each, the gradients and the expert counts after; the
// logits of every row of a sampling forward (B = 1, no targets).
struct Outcome {
    std::vector<double> losses;
    std::vector<float> grads, logits;
    std::vector<std::vector<int64_t>> counts;
    size_t activation_floats = 0;
};

Outcome two_micro_batches(const Config& c, Precision precision, const ActivationLayout& layout) {
    Model m;
    model_init(m, c);
    m.precision = precision;
    m.layout = layout;
    randomize_for_test(m, 21);
    const int B = 2, T = 12;
    Outcome out;
    model_zero_grads(m);
    for (uint64_t micro = 0; micro < 2; micro++) {
        const std::vector<int32_t> in = random_tokens(B * T, c.vocab_size, 22 + 2 * micro),
                                   tg = random_tokens(B * T, c.vocab_size, 23 + 2 * micro);
        const LossParts l = model_forward(m, in.data(), tg.data(), B, T, true);
        out.losses.insert(out.losses.end(), {l.total, l.main, l.mtp, l.balance});
        model_backward(m, 0.75f);
    }
    out.grads = m.grads;
    out.counts = m.expert_counts;
    out.activation_floats = m.act_storage.size() + m.set_storage.size();
    const std::vector<int32_t> prompt = random_tokens(T, c.vocab_size, 27);
    model_forward(m, prompt.data(), nullptr, 1, T, false);
    out.logits.resize((int64_t)T * c.vocab_size);
    for (int t = 0; t < T; t++) model_logits_row(m, t, out.logits.data() + (int64_t)t * c.vocab_size);
    return out;
}

// With and without recompute, the heads in chunks of head_rows rows (0: one chunk)
void check_same_bits(const Config& c, Precision precision, int64_t head_rows) {
    ActivationLayout keeping, recomputing;
    if (head_rows > 0) keeping.head_chunk_values = recomputing.head_chunk_values = head_rows * c.vocab_size;
    recomputing.recompute = true;
    const Outcome keep = two_micro_batches(c, precision, keeping), again = two_micro_batches(c, precision, recomputing);
    CHECK(again.losses == keep.losses);
    CHECK(again.grads == keep.grads);
    CHECK(again.counts == keep.counts);
    CHECK(again.logits == keep.logits);
    CHECK(again.activation_floats < keep.activation_floats);
}

// The trainer's checkpoint after 3 steps of `small`-like training on `ranks` ranks, as bytes.
std::string checkpoint_after_3_steps(int ranks, bool recompute) {
    const std::string dir = test_path(std::string("recompute_") + std::to_string(ranks) + (recompute ? "_on" : "_off"));
    const std::string cmd = mpirun_command(ranks) + "./train_cpu --config test/data/ep-tiny.json --data "
                            "'data/default/train_*.bin' --seq 32 --batch 2 --lr 1e-2 --steps 3 --ep " +
                            std::to_string(ranks) + " --checkpoint-dir " + dir + (recompute ? " --recompute" : "");
    const CommandResult r = run_logged(cmd, "recompute_train.txt", 120);
    REQUIRE_MESSAGE(r.status == 0, r.out);
    const std::string bytes = slurp(dir + "/ckpt_00000003.safetensors");
    REQUIRE(!bytes.empty());
    return bytes;
}

}  // namespace

TEST_CASE("recompute: the activation sets, one per block without, one per kind of block with") {
    const Config tiny = load_config("tiny");  // block 0 dense, blocks 1.. MoE, the MTP block MoE
    std::vector<int> own(tiny.num_blocks()), shared(tiny.num_blocks(), 1);
    for (int l = 0; l < tiny.num_blocks(); l++) own[l] = l;
    shared[0] = 0;
    CHECK(block_sets(tiny, false) == own);
    CHECK(block_sets(tiny, true) == shared);
}

TEST_CASE("recompute: the heads' chunks hold at most 64 Mi logits and start on 256 bytes") {
    Config c = load_config("small");
    const ActivationLayout layout;
    CHECK(head_chunk_rows(c, 1024, layout) == 1024);  // all of small's batch: 1024 x 1024 logits
    c.vocab_size = 102400;                             // V2-Lite's: 2^26 / 102400 = 655 rows
    CHECK(head_chunk_rows(c, 8192, layout) == 655);
    c.vocab_size = 50257;  // GPT-2's, odd: 2^26 / 50257 = 1335 rows, down to 1280, a multiple of 64
    CHECK(head_chunk_rows(c, 8192, layout) == 1280);
    CHECK(head_chunk_rows(c, 100, layout) == 100);
}

TEST_CASE("recompute: the CPU model's losses, gradients and expert counts are the same bits, with fewer activations") {
    const Config tiny = load_config("tiny");  // q_lora, dense and MoE blocks, shared experts, MTP, balance loss
    Config routed = tiny;                     // every block MoE, no MTP
    routed.first_k_dense_replace = 0;
    routed.num_nextn_predict_layers = 0;
    SUBCASE("tiny fp32") { check_same_bits(tiny, Precision::FP32, 0); }
    SUBCASE("tiny fp8") { check_same_bits(tiny, Precision::FP8, 0); }
    SUBCASE("every block MoE, no MTP") { check_same_bits(routed, Precision::FP32, 0); }
    SUBCASE("tiny, the heads in chunks of 5 rows") { check_same_bits(tiny, Precision::FP32, 5); }
}

TEST_CASE("recompute: the heads in chunks of rows give the losses, gradients and logits of one chunk") {
    // Only the sums over rows into the head's weight gradient are grouped differently (per chunk, then over the
    // chunks): FP32 rounding of sums of 24 terms, relative 1e-6 of the tensor's largest value; the losses are sums of
    // the same per-row doubles (1e-12), the logits the same dot products (exact).
    const Config tiny = load_config("tiny");
    ActivationLayout chunked;
    chunked.head_chunk_values = 5 * (int64_t)tiny.vocab_size;
    const Outcome one = two_micro_batches(tiny, Precision::FP32, ActivationLayout{}),
                  five = two_micro_batches(tiny, Precision::FP32, chunked);
    for (size_t i = 0; i < one.losses.size(); i++) CHECK_REL(five.losses[i], one.losses[i], 1e-12);
    CHECK(five.logits == one.logits);
    CHECK(five.counts == one.counts);
    for (const ParamTensor& t : build_param_table(tiny).tensors) {
        double diff = 0.0, scale = 0.0;
        for (int64_t i = t.offset; i < t.offset + t.numel; i++) {
            diff = std::max(diff, (double)std::fabs(five.grads[i] - one.grads[i]));
            scale = std::max(scale, (double)std::fabs(one.grads[i]));
        }
        INFO(t.name);
        CHECK(diff <= 1e-6 * scale);
    }
}

TEST_CASE("recompute: train_cpu --recompute writes the checkpoint it writes without, on 1 rank and with EP 2") {
    for (int ranks : {1, 2}) {
        INFO("ranks " << ranks);
        CHECK(checkpoint_after_3_steps(ranks, true) == checkpoint_after_3_steps(ranks, false));
    }
}
