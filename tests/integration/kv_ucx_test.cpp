// The prefill → decode hand-off over UCX between real agent processes: the
// decode agent reads the prefill agent's blocks one-sidedly, computes only
// the rest, and produces the tokens a colocated agent produces; the prefill
// agent frees its held blocks when released (or after its hold times out).
// Each case runs over shared memory and over TCP.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/hmac.h"
#include "tests/support/httplib_serving.h"
#include "tests/support/ucx_agents.h"

namespace {

using namespace ::tandem::testing;  // NOLINT: the test vocabulary

class KvUcx : public UcxTransportTest {
 protected:
  // 75 tokens: 4 full blocks move, the 11-token tail is computed by decode.
  std::vector<int> prompt_ = randomPrompt(75, 31);

  static json prefill(const Agent& agent, const std::vector<int>& prompt) {
    return prefillOn(agent, prompt);
  }
  static json decode(const Agent& agent, const std::vector<int>& prompt, json params,
                     int* status = nullptr) {
    return decodeOn(agent, prompt, std::move(params), 8, status);
  }
};

TEST_P(KvUcx, DecodeReadsThePrefilledBlocksAndMatchesAColocatedAgent) {
  std::vector<int> expected;
  {
    Agent colocated;
    expected = tokenIds(colocated.post("/v1/completions", greedy(prompt_, 8)));
  }
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});
  json params = prefill(prefiller, prompt_);
  ASSERT_TRUE(params.is_object()) << "the prefill response must say where its KV is";
  EXPECT_EQ(params["remote_block_ids"].size(), 4u);
  EXPECT_EQ(params["remote_num_tokens"], 64);
  EXPECT_EQ(prefiller.metric("tandem_kv_held_blocks"), 5)
      << "the request's blocks (4 full + 1 partial) are held for the reader";

  const double computed_before = decoder.metric("tandem_computed_tokens_total");
  EXPECT_EQ(tokenIds(decode(decoder, prompt_, params)), expected);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  EXPECT_EQ(decoder.metric("tandem_computed_tokens_total") - computed_before, 11 + 7);
  // 4 blocks of the tiny model: 2 layers x K,V x 16 tokens x 2 KV heads x 16 x 2 bytes.
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_bytes_total"), 4 * 4096);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_duration_seconds_count"), 1);
  // The release message frees the prefill agent's blocks (also checked by
  // ~Agent: nothing referenced at the end).
  EXPECT_TRUE(eventually([&] {
    return prefiller.metric("tandem_kv_cache_usage_ratio") == 0 &&
           prefiller.metric("tandem_kv_held_blocks") == 0;
  }));
}

// Holds of finished prefills whose readers do not come give way, oldest
// first, once they keep a waiting request out (no free block, nothing
// running) and are older than --kv-hold-yield-after: the prefill agent goes
// on serving instead of waiting abort_timeout_s (120 s here). A reader that
// comes later for a yielded hold finds it ended and computes the prompt.
TEST_P(KvUcx, FinishedPrefillHoldsGiveWayToRequestsThatNeedTheirBlocks) {
  // 16 blocks: three held prefills of 5 blocks each leave one free.
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer"), "--num-blocks", "16",
                   "--kv-hold-yield-after", "1"});
  std::vector<std::vector<int>> prompts;
  std::vector<json> held;
  for (uint32_t seed : {61u, 62u, 63u}) {
    prompts.push_back(randomPrompt(75, seed));
    held.push_back(prefill(prefiller, prompts.back()));
    ASSERT_EQ(held.back()["remote_block_ids"].size(), 4u) << held.back().dump();
  }
  EXPECT_EQ(prefiller.metric("tandem_kv_held_blocks"), 15);
  EXPECT_EQ(prefiller.metric("tandem_kv_holds_yielded_total"), 0);
  // A fourth needs 5 blocks: the oldest hold gives way once it is 1 s old.
  prompts.push_back(randomPrompt(75, 64));
  held.push_back(prefill(prefiller, prompts.back()));
  ASSERT_EQ(held.back()["remote_block_ids"].size(), 4u) << held.back().dump();
  EXPECT_EQ(prefiller.metric("tandem_kv_holds_yielded_total"), 1);
  EXPECT_EQ(prefiller.metric("tandem_kv_held_blocks"), 15);

  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});
  Agent colocated;
  for (size_t i : {size_t{0}, size_t{1}}) {
    EXPECT_EQ(tokenIds(decode(decoder, prompts[i], held[i])),
              tokenIds(colocated.post("/v1/completions", greedy(prompts[i], 8))))
        << "prompt " << i;
  }
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"hold_ended\""), 1)
      << "the first prompt's hold had given way: its blocks are not used";
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4)
      << "the second's were still held";
  for (size_t i : {size_t{2}, size_t{3}}) releaseOn(prefiller, held[i]);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

TEST_P(KvUcx, DecodeKvBytesEqualThePrefillAgentsAndAColocatedAgents) {
  TempDir prefill_dir("tandem-kv-bytes-p"), decode_dir("tandem-kv-bytes-d"),
      colocated_dir("tandem-kv-bytes-c");
  Agent prefiller({"--kv-transfer-config", ucxWithBlockFiles("kv_producer", prefill_dir.path())});
  Agent decoder({"--kv-transfer-config", ucxWithBlockFiles("kv_consumer", decode_dir.path())});
  Agent colocated({"--kv-transfer-config", ucxWithBlockFiles("kv_producer", colocated_dir.path())});
  for (uint32_t seed : {81u, 82u}) {
    const std::vector<int> prompt = randomPrompt(75, seed);
    json params = prefill(prefiller, prompt);
    EXPECT_EQ(tokenIds(decode(decoder, prompt, params)),
              tokenIds(colocated.post("/v1/completions", greedy(prompt, 8))));
  }
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 8);
  const auto prefilled = blockFiles(prefill_dir.path());
  const auto decoded = blockFiles(decode_dir.path());
  const auto reference = blockFiles(colocated_dir.path());
  // 4 prompt blocks per prompt were prefilled; the decode agent holds those
  // (read) and one more each (its tail and generated tokens).
  EXPECT_EQ(prefilled.size(), 8u);
  EXPECT_EQ(decoded.size(), 10u);
  EXPECT_EQ(reference.size(), 10u);
  for (const auto& [path, bytes] : prefilled) {
    ASSERT_EQ(decoded.count(path), 1u) << path;
    EXPECT_TRUE(decoded.at(path) == bytes) << "read block differs: " << path;
  }
  for (const auto& [path, bytes] : decoded) {
    ASSERT_EQ(reference.count(path), 1u) << path;
    EXPECT_TRUE(reference.at(path) == bytes)
        << "the disaggregated run's KV differs from a colocated run's: " << path;
  }
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

// With --compute-dtype bf16 on every agent the hand-off is as exact as with
// the default: the decode agent's tokens and KV bytes are a colocated bf16
// agent's. An agent computing in f32 refuses the bf16 agents' blocks (the
// compute dtype is part of the model identity in the compatibility string).
TEST_P(KvUcx, Bf16ComputeHandOffMatchesAColocatedBf16AgentAndNotAnF32One) {
  TempDir prefill_dir("tandem-kv-bf16-p"), decode_dir("tandem-kv-bf16-d"),
      colocated_dir("tandem-kv-bf16-c");
  auto bf16 = [](std::string config) {
    return std::vector<std::string>{"--compute-dtype", "bf16", "--kv-transfer-config", config};
  };
  Agent prefiller(bf16(ucxWithBlockFiles("kv_producer", prefill_dir.path())));
  Agent decoder(bf16(ucxWithBlockFiles("kv_consumer", decode_dir.path())));
  Agent colocated(bf16(ucxWithBlockFiles("kv_producer", colocated_dir.path())));
  const json params = prefill(prefiller, prompt_);
  ASSERT_TRUE(params.is_object());
  EXPECT_NE(params["compatibility"].get<std::string>().find("/compute-bf16"), std::string::npos)
      << params.dump();
  EXPECT_EQ(tokenIds(decode(decoder, prompt_, params)),
            tokenIds(colocated.post("/v1/completions", greedy(prompt_, 8))));
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  const auto decoded = blockFiles(decode_dir.path());
  const auto reference = blockFiles(colocated_dir.path());
  EXPECT_EQ(decoded.size(), 5u);
  for (const auto& [path, bytes] : decoded) {
    ASSERT_EQ(reference.count(path), 1u) << path;
    EXPECT_TRUE(reference.at(path) == bytes) << "KV differs from a colocated bf16 run: " << path;
  }

  Agent exact({"--kv-transfer-config", ucxConfig("kv_consumer")});
  const json again = prefill(prefiller, prompt_);
  int status = 0;
  const json error = decode(exact, prompt_, again, &status);
  EXPECT_EQ(status, 400) << error.dump();
  EXPECT_NE(error.dump().find("compute-bf16"), std::string::npos) << error.dump();
  EXPECT_EQ(exact.metric("tandem_kv_transfer_failures_total", "reason=\"incompatible\""), 1);
  // The refused transfer's blocks are released by a reader that can take them.
  EXPECT_EQ(tokenIds(decode(decoder, prompt_, again)).size(), 8u);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

// The producer's KV is of its own tokens: a decode agent whose prompt
// differs (its chat template rendered another date than the prefill
// agent's, past midnight or in another time zone) finds its own hash of the
// last block it would read differs from the producer's
// (remote_last_block_hashes), reads nothing, computes the whole prompt and
// lets the producer's blocks go. Before, it read the other prompt's KV and
// answered as if it had been given that prompt. A prompt ending on a block
// boundary reads one block fewer than offered, checked against the
// second-to-last hash; a prompt shorter by more is computed.
TEST_P(KvUcx, KvOfAnotherPromptIsNotReadAndThePromptIsComputed) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});
  Agent colocated;
  const json params = prefill(prefiller, prompt_);
  ASSERT_TRUE(params.is_object());
  ASSERT_EQ(params["remote_last_block_hashes"].size(), 2u) << params.dump();
  std::vector<int> other = prompt_;
  other[20] = other[20] == 7 ? 8 : 7;  // block 1 differs, so blocks 1 to 3 do
  const double computed_before = decoder.metric("tandem_computed_tokens_total");
  EXPECT_EQ(tokenIds(decode(decoder, other, params)),
            tokenIds(colocated.post("/v1/completions", greedy(other, 8))));
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  EXPECT_EQ(decoder.metric("tandem_computed_tokens_total") - computed_before, 75 + 7);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"prefix_mismatch\""), 1);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));

  // 64 tokens: 4 full blocks offered, the first 3 wanted (the last token's
  // block is computed), matched by the second-to-last hash; block 0 is
  // cached here already (the other prompt shares it), so 2 are read.
  const std::vector<int> aligned(prompt_.begin(), prompt_.begin() + 64);
  const json aligned_params = prefill(prefiller, aligned);
  EXPECT_EQ(aligned_params["remote_block_ids"].size(), 4u);
  EXPECT_EQ(tokenIds(decode(decoder, aligned, aligned_params)),
            tokenIds(colocated.post("/v1/completions", greedy(aligned, 8))));
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 2);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"prefix_mismatch\""), 1);

  // A prompt two blocks shorter than the producer's (and other than its
  // first 40 tokens) is another prompt too: computed, not refused (it was a
  // 400 at admission).
  Agent fresh({"--kv-transfer-config", ucxConfig("kv_consumer")});
  const std::vector<int> shorter(other.begin(), other.begin() + 40);
  const json longer = prefill(prefiller, prompt_);
  int status = 0;
  const json answer = decode(fresh, shorter, longer, &status);
  EXPECT_EQ(status, 200) << answer.dump();
  EXPECT_EQ(tokenIds(answer), tokenIds(colocated.post("/v1/completions", greedy(shorter, 8))));
  EXPECT_EQ(fresh.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  EXPECT_EQ(fresh.metric("tandem_kv_transfer_failures_total", "reason=\"prefix_mismatch\""), 1);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

// A producer lets its blocks go abort_timeout_s after its answer
// (remote_hold_until_ms, signed), and may reuse them after: a decode agent
// that could not finish a read before then (less a margin) reads nothing and
// computes the prompt. Here the hold (4 s) is shorter than a read may take
// (read_timeout_s 10 s).
TEST_P(KvUcx, BlocksWhoseHoldEndsBeforeAReadCouldAreNotRead) {
  Agent prefiller({"--kv-transfer-config",
                   ucxConfig("kv_producer", {{"abort_timeout_s", 4}, {"secret", "kappa"}})});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer", {{"secret", "kappa"}})});
  Agent colocated;
  const json params = prefill(prefiller, prompt_);
  const int64_t hold_until = params["remote_hold_until_ms"];
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  EXPECT_GT(hold_until, now);
  EXPECT_LE(hold_until, now + 4000);
  // The time is signed: a client cannot stretch it.
  json stretched = params;
  stretched["remote_hold_until_ms"] = hold_until + 600000;
  int status = 0;
  decode(decoder, prompt_, stretched, &status);
  EXPECT_EQ(status, 403);
  EXPECT_EQ(tokenIds(decode(decoder, prompt_, params)),
            tokenIds(colocated.post("/v1/completions", greedy(prompt_, 8))));
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"hold_expired\""), 1);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

// A descriptor is good only while its hold lasts. Released by someone else
// (the explicit release anyone with the descriptor may send), or read once
// already, its blocks may hold another request's KV when they are read: the
// reader checks the producer's hold ticket after its read and computes the
// prompt instead, and caches only what it computed.
TEST_P(KvUcx, BlocksReadAfterTheirHoldEndedAreNotUsed) {
  // 12 blocks: the three other prompts below (5 blocks each) must reuse the
  // released ones.
  Agent prefiller({"--num-blocks", "12", "--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});
  Agent colocated;
  const std::vector<int> expected = tokenIds(colocated.post("/v1/completions", greedy(prompt_, 8)));
  const json params = prefill(prefiller, prompt_);
  ASSERT_EQ(params["remote_hold_ticket"].get<std::string>().size(), 16u) << params.dump();
  EXPECT_EQ(releaseOn(prefiller, params)["released"], true);
  // The freed blocks go to other prompts.
  for (int seed : {91, 92, 93}) releaseOn(prefiller, prefill(prefiller, randomPrompt(75, seed)));
  const double computed_before = decoder.metric("tandem_computed_tokens_total");
  EXPECT_EQ(tokenIds(decode(decoder, prompt_, params)), expected);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"hold_ended\""), 1);
  EXPECT_EQ(decoder.metric("tandem_computed_tokens_total") - computed_before, 75 + 7);
  // Blocks of a failed load stay out of the prefix cache: a later request
  // computes the prompt again.
  const json later = decoder.post("/v1/completions", greedy(prompt_, 8));
  EXPECT_EQ(later["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(tokenIds(later), expected);

  // Read twice: the first reader's release ends the hold, so a second
  // reader of the same descriptor (a retry elsewhere) reads nothing usable.
  Agent first({"--kv-transfer-config", ucxConfig("kv_consumer")});
  Agent second({"--kv-transfer-config", ucxConfig("kv_consumer")});
  const json again = prefill(prefiller, prompt_);
  EXPECT_EQ(tokenIds(decode(first, prompt_, again)), expected);
  EXPECT_EQ(first.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
  EXPECT_EQ(tokenIds(decode(second, prompt_, again)), expected);
  EXPECT_EQ(second.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  EXPECT_EQ(second.metric("tandem_kv_transfer_failures_total", "reason=\"hold_ended\""), 1);
  EXPECT_EQ(prefiller.metric("tandem_kv_held_blocks"), 0);
}

// More holds offering blocks than hold_slots: the next finished request's
// descriptor offers none (its reader computes the prompt) until a hold ends.
TEST_P(KvUcx, AProducerWithEveryHoldTicketTakenOffersNoBlocks) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer", {{"hold_slots", 1}})});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});
  Agent colocated;
  const json first = prefill(prefiller, prompt_);
  EXPECT_EQ(first["remote_block_ids"].size(), 4u);
  EXPECT_EQ(prefiller.metric("tandem_kv_hold_slots"), 1);
  EXPECT_EQ(prefiller.metric("tandem_kv_hold_slots_used"), 1);
  const std::vector<int> other = randomPrompt(75, 57);
  const json second = prefill(prefiller, other);
  EXPECT_EQ(second["remote_block_ids"].size(), 0u) << second.dump();
  EXPECT_FALSE(second.contains("remote_hold_ticket")) << second.dump();
  EXPECT_EQ(prefiller.metric("tandem_kv_transfer_failures_total", "reason=\"holds_full\""), 1);
  EXPECT_EQ(prefiller.metric("tandem_kv_held_blocks"), 5) << "only the first prompt's are held";
  // A lend asked for now has no ticket either: refused as for a while, not
  // as if the agent could never lend.
  int status = 0;
  const json lend = prefiller.post("/v1/kv_transfer/hold", {{"token_ids", prompt_}}, &status);
  EXPECT_EQ(status, 503) << lend.dump();
  EXPECT_NE(lend.dump().find("no KV hold ticket or staging slot is free"), std::string::npos)
      << lend.dump();
  EXPECT_EQ(tokenIds(decode(decoder, other, second)),
            tokenIds(colocated.post("/v1/completions", greedy(other, 8))));
  EXPECT_EQ(tokenIds(decode(decoder, prompt_, first)),
            tokenIds(colocated.post("/v1/completions", greedy(prompt_, 8))));
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
  EXPECT_EQ(prefiller.metric("tandem_kv_hold_slots_used"), 0);
  // The reader's release gave the ticket back.
  const json third = prefill(prefiller, randomPrompt(75, 58));
  EXPECT_EQ(third["remote_block_ids"].size(), 4u);
  EXPECT_EQ(releaseOn(prefiller, third)["released"], true);
}

TEST_P(KvUcx, DecodeReadsOnlyTheBlocksItLacks) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});
  // The decode agent already holds the first 2 blocks (an earlier turn).
  std::vector<int> earlier(prompt_.begin(), prompt_.begin() + 40);
  decoder.post("/v1/completions", greedy(earlier, 1));
  json params = prefill(prefiller, prompt_);
  json out = decode(decoder, prompt_, params);
  EXPECT_EQ(out["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 2);
  Agent colocated;
  EXPECT_EQ(tokenIds(out), tokenIds(colocated.post("/v1/completions", greedy(prompt_, 8))));
}

TEST_P(KvUcx, MalformedBogusOrIncompatibleParametersAreRefusedNamingTheField) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});
  const json params = prefill(prefiller, prompt_);
  ASSERT_TRUE(params.is_object());
  struct Case {
    std::function<void(json&)> spoil;
    int status;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](json& p) { p["remote_block_ids"][2] = 1 << 30; }, 400,
       "kv_transfer_params.remote_block_ids[2] = 1073741824 is outside the other agent's"},
      {[](json& p) { p["remote_block_ids"][3] = p["remote_block_ids"][0]; }, 400,
       "kv_transfer_params.remote_block_ids[3]"},
      {[](json& p) { p["remote_block_ids"][1] = "one"; }, 400,
       "kv_transfer_params.remote_block_ids[1] must be an integer"},
      {[](json& p) { p["remote_num_tokens"] = 48; }, 400,
       "kv_transfer_params.remote_num_tokens (48) must be remote_block_ids' length (4)"},
      {[](json& p) { p["remote_slab"] = "ucx1:1000:4096:8:" + std::string(64, 'f') + ":ff"; }, 400,
       "kv_transfer_params.remote_slab is not accepted"},
      {[](json& p) { p["remote_host"] = "evil host\n" + std::string(300, 'f'); }, 400,
       "kv_transfer_params.remote_host must be a host name or IP address"},
      {[](json& p) { p["remote_port"] = 70000; }, 400,
       "kv_transfer_params.remote_port must be an integer between 1 and 65535, got 70000"},
      {[](json& p) { p["remote_engine_id"] = 7; }, 400,
       "kv_transfer_params.remote_engine_id must be a string"},
      {[](json& p) { p["remote_num_blocks"] = 0; }, 400,
       "kv_transfer_params.remote_num_blocks must be an integer between 1 and 2147483647"},
      {[](json& p) { p["remote_block_ids"][0] = uint64_t{1} << 63; }, 400,
       "kv_transfer_params.remote_block_ids[0] = 9223372036854775808 is outside"},
      {[](json& p) { p.erase("transfer_id"); }, 400,
       "kv_transfer_params.transfer_id must be a string"},
      {[](json& p) { p["do_remote_prefill"] = "yes"; }, 400,
       "kv_transfer_params.do_remote_prefill must be true or false"},
      {[](json& p) { p.erase("remote_hold_ticket"); }, 400,
       "kv_transfer_params.remote_hold_ticket is missing: remote_hold_slot and remote_hold_ticket "
       "must come with remote_block_ids"},
      {[](json& p) { p["remote_hold_ticket"] = "0102030405060708090a"; }, 400,
       "kv_transfer_params.remote_hold_ticket must be a string of 16 lower-case hex characters"},
      {[](json& p) { p["transfer_id"] = std::string(600, 't'); }, 400,
       "kv_transfer_params.transfer_id must be at most 512 characters, got 600"},
      {[](json& p) { p["remote_engine_id"] = std::string(513, 'e'); }, 400,
       "kv_transfer_params.remote_engine_id must be at most 512 characters, got 513"},
      {[](json& p) { p["remote_block_ids"][1] = 18446744073709551616.0; }, 400,
       "kv_transfer_params.remote_block_ids[1] = 1.8446744073709552e+19 is outside the other "
       "agent's"},
      {[](json& p) { p["remote_hold_slot"] = -1; }, 400,
       "kv_transfer_params.remote_hold_slot must be an integer between 0 and 16777215"},
      {[](json& p) {
         std::string c = p["compatibility"];
         p["compatibility"] = c.replace(c.find("block_size=16"), 13, "block_size=32");
       },
       400, "ours block_size=16, theirs block_size=32"},
  };
  for (const Case& c : cases) {
    json spoiled = params;
    c.spoil(spoiled);
    json body = greedy(prompt_, 8);
    body["kv_transfer_params"] = spoiled;
    if (!spoiled.contains("do_remote_prefill"))
      body["kv_transfer_params"]["do_remote_prefill"] = true;
    int status = 0;
    json error = decoder.post("/v1/completions", body, &status);
    EXPECT_EQ(status, c.status) << c.message << ": " << error.dump();
    EXPECT_NE(error.dump().find(c.message), std::string::npos) << error.dump();
  }
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"bad_params\""), 18);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"incompatible\""), 1);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  // The decode agent keeps serving; the refused transfer's blocks are given
  // back by an explicit release (the router's job when it gives up).
  // An end of the hold as far off as an int64 allows is read as any later
  // end is (its time left once overflowed into a "hold ends too soon").
  json lasting = params;
  lasting["remote_hold_until_ms"] = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(tokenIds(decode(decoder, prompt_, lasting)).size(), 8u);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"hold_expired\""), 0);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

// An HTTP server in the test process that answers KV handshakes the way
// `answer` says: a producer that lies.
class FakeProducer {
 public:
  explicit FakeProducer(std::function<json()> answer) : answer_(std::move(answer)) {
    server_.Post("/v1/kv_transfer/handshake",
                 [this](const httplib::Request&, httplib::Response& res) {
                   ++handshakes_;
                   res.set_content(answer_().dump(), "application/json");
                 });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = serveOnThread(server_);
  }
  ~FakeProducer() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  int handshakes() const { return handshakes_.load(); }

 private:
  std::function<json()> answer_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> handshakes_{0};
};

// "ucx1:<base hex>:<block bytes>:<blocks>:<worker address hex>:<rkey hex>"
std::string slabText(const std::string& worker_address_hex, int64_t num_blocks,
                     int64_t block_bytes = 4096) {
  return "ucx1:7f0000000000:" + std::to_string(block_bytes) + ":" + std::to_string(num_blocks) +
         ":" + worker_address_hex + ":" + std::string(40, 'f');
}

TEST_P(KvUcx, GarbageFromAFakeProducerIsRecomputedAndTheDecodeAgentStaysAlive) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});  // no secret
  Agent colocated;
  const std::vector<int> expected = tokenIds(colocated.post("/v1/completions", greedy(prompt_, 8)));
  const json real = prefill(prefiller, prompt_);
  ASSERT_TRUE(real.is_object());
  const std::string engine = real["remote_engine_id"];
  const int64_t blocks = real["remote_num_blocks"];
  // The real producer's own answer, for hold tables that are not one.
  const json own = prefiller.post("/v1/kv_transfer/handshake", {{"nonce", std::string(32, 'a')}});
  ASSERT_TRUE(own.contains("remote_holds")) << own.dump();
  std::string other_worker = own["remote_holds"];
  // "ucx1:<base>:<bytes>:<words>:<worker address hex>:<rkey hex>": one
  // digit of the worker address changed.
  const size_t worker_at = other_worker.find(':', other_worker.find(':', 5) + 1);
  const size_t digit = other_worker.find(':', worker_at + 1) + 3;
  other_worker[digit] = other_worker[digit] == '0' ? '1' : '0';
  const std::string fake_holds = slabText(std::string(64, 'f'), 65536, 8);
  // Worker addresses UCX would assert on, or that name nothing; a handshake
  // naming another engine (a restart); answers that are not handshakes; hold
  // tables missing, of other words than 8 bytes, or on another worker.
  struct Case {
    json answer;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {{{"engine_id", engine},
        {"compatibility", real["compatibility"]},
        {"remote_slab", own["remote_slab"]}},
       "bad_handshake"},
      {{{"engine_id", engine},
        {"compatibility", real["compatibility"]},
        {"remote_slab", own["remote_slab"]},
        {"remote_holds", own["remote_slab"]}},
       "bad_handshake"},
      {{{"engine_id", engine},
        {"compatibility", real["compatibility"]},
        {"remote_slab", own["remote_slab"]},
        {"remote_holds", other_worker}},
       "bad_handshake"},
      {{{"engine_id", engine},
        {"compatibility", real["compatibility"]},
        {"remote_slab", slabText(std::string(64, 'f'), blocks)}},
       "bad_handshake"},
      {{{"engine_id", engine},
        {"compatibility", real["compatibility"]},
        {"remote_slab", slabText("ff", blocks)}},
       "bad_handshake"},
      {{{"engine_id", engine},
        {"compatibility", real["compatibility"]},
        {"remote_slab", slabText(std::string(64, 'f'), blocks + 1)}},
       "bad_handshake"},
      {{{"engine_id", engine}, {"compatibility", real["compatibility"]}, {"remote_slab", "zz"}},
       "bad_handshake"},
      {{{"engine_id", "another"},
        {"compatibility", real["compatibility"]},
        {"remote_slab", slabText(std::string(64, 'f'), blocks)}},
       "peer_restarted"},
      {{{"engine_id", engine}, {"compatibility", "model=other"}, {"remote_slab", "zz"}},
       "incompatible"},
      {json::array({1, 2}), "bad_handshake"},
  };
  std::map<std::string, double> counted;
  for (Case c : cases) {
    if (c.answer.is_object() && c.answer.contains("remote_slab") && c.answer.size() == 3 &&
        c.answer["remote_slab"] != own["remote_slab"]) {
      c.answer["remote_holds"] = fake_holds;
    }
    FakeProducer fake([&] { return c.answer; });
    json forged = real;
    forged["remote_port"] = fake.port();
    int status = 0;
    json out = decode(decoder, prompt_, forged, &status);
    ASSERT_EQ(status, 200) << c.answer.dump() << " → " << out.dump();
    EXPECT_EQ(tokenIds(out), expected) << c.answer.dump();
    EXPECT_EQ(fake.handshakes(), 1) << c.answer.dump();
    EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"" + c.reason + "\""),
              ++counted[c.reason])
        << c.answer.dump();
  }
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_recomputed_total"), 4.0 * cases.size());
  // A producer nobody answers for.
  json nowhere = real;
  nowhere["remote_port"] = FakeProducer([] { return json::object(); }).port();
  EXPECT_EQ(tokenIds(decode(decoder, prompt_, nowhere)), expected);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"unreachable\""), 1);
  // Still alive, and the real producer's descriptor still works.
  EXPECT_EQ(tokenIds(decode(decoder, prompt_, real)), expected);
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

// What a producer signs (docs/kv-transfer.md, "Authentication").
std::string signingText(const json& p) {
  std::string ids;
  for (const json& id : p["remote_block_ids"]) {
    if (!ids.empty()) ids += ',';
    ids += id.dump();
  }
  std::string hashes;
  for (const json& hash : p.value("remote_last_block_hashes", json::array())) {
    if (!hashes.empty()) hashes += ',';
    hashes += hash.get<std::string>();
  }
  return "tandem-kv-transfer/4\n" + p["transfer_id"].get<std::string>() + "\n" +
         p["remote_engine_id"].get<std::string>() + "\n" + p["remote_host"].get<std::string>() +
         "\n" + p["remote_port"].dump() + "\n" + p["remote_num_blocks"].dump() + "\n" +
         p["remote_num_tokens"].dump() + "\n" + ids + "\n" + p["compatibility"].get<std::string>() +
         "\n" + hashes + "\n" + p["remote_hold_until_ms"].dump() + "\n" +
         p["remote_hold_slot"].dump() + "\n" + p["remote_hold_ticket"].get<std::string>();
}

TEST_P(KvUcx, SignedBlockIdsBeyondTheSlabOrInt32AreRefusedAsOutOfRange) {
  const json secret = {{"secret", "delta"}};
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer", secret)});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer", secret)});
  const json params = prefill(prefiller, prompt_);
  ASSERT_EQ(params["signature"], ::tandem::hmacSha256Hex("delta", signingText(params)))
      << "the signed text is as documented";
  const int64_t blocks = params["remote_num_blocks"];
  for (int64_t bad : {int64_t{1} << 31, blocks, int64_t{-1}}) {
    json forged = params;
    forged["remote_block_ids"][1] = bad;
    forged["signature"] = ::tandem::hmacSha256Hex("delta", signingText(forged));
    int status = 0;
    json error = decode(decoder, prompt_, forged, &status);
    EXPECT_EQ(status, 400) << error.dump();
    EXPECT_NE(error.dump().find("kv_transfer_params.remote_block_ids[1] = " + std::to_string(bad) +
                                " is outside the other agent's " + std::to_string(blocks) +
                                " blocks (accepted: 0 to " + std::to_string(blocks - 1) + ")"),
              std::string::npos)
        << error.dump();
  }
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"bad_params\""), 3);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"auth\""), 0);
  EXPECT_EQ(releaseOn(prefiller, params)["released"], true);
}

TEST_P(KvUcx, HandshakeAnswersOnlyPeersWithTheSecret) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer", {{"secret", "alpha"}})});
  Agent open_prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  Agent consumer({"--kv-transfer-config", ucxConfig("kv_consumer")});
  const std::string nonce(32, 'a');
  int status = 0;
  json answer = prefiller.post("/v1/kv_transfer/handshake", {{"nonce", nonce}}, &status);
  EXPECT_EQ(status, 403) << answer.dump();
  EXPECT_EQ(answer.dump().find("ucx1:"), std::string::npos) << "nothing is learnt without it";
  answer = prefiller.post("/v1/kv_transfer/handshake",
                          {{"nonce", nonce}, {"signature", std::string(64, '0')}}, &status);
  EXPECT_EQ(status, 403) << answer.dump();
  EXPECT_EQ(prefiller.metric("tandem_kv_transfer_failures_total", "reason=\"auth\""), 2);
  answer = prefiller.post(
      "/v1/kv_transfer/handshake",
      {{"nonce", nonce},
       {"signature", ::tandem::hmacSha256Hex("alpha", "tandem-kv-handshake-request/1\n" + nonce)}},
      &status);
  ASSERT_EQ(status, 200) << answer.dump();
  EXPECT_EQ(answer["signature"],
            ::tandem::hmacSha256Hex("alpha", "tandem-kv-handshake/2\n" + nonce + "\n" +
                                                 answer["engine_id"].get<std::string>() + "\n" +
                                                 answer["compatibility"].get<std::string>() + "\n" +
                                                 answer["remote_slab"].get<std::string>() + "\n" +
                                                 answer["remote_holds"].get<std::string>()));
  // Without a secret anyone may ask; malformed asks are refused naming the field.
  answer = open_prefiller.post("/v1/kv_transfer/handshake", {{"nonce", nonce}}, &status);
  EXPECT_EQ(status, 200) << answer.dump();
  EXPECT_FALSE(answer.contains("signature"));
  answer = open_prefiller.post("/v1/kv_transfer/handshake", {{"nonce", "xyz"}}, &status);
  EXPECT_EQ(status, 400) << answer.dump();
  EXPECT_NE(answer.dump().find("nonce must be a string of 16 to 128 hex characters"),
            std::string::npos);
  answer = consumer.post("/v1/kv_transfer/handshake", {{"nonce", nonce}}, &status);
  EXPECT_EQ(status, 404) << answer.dump();
  Agent plain;
  answer = plain.post("/v1/kv_transfer/handshake", {{"nonce", nonce}}, &status);
  EXPECT_EQ(status, 404) << answer.dump();
}

TEST_P(KvUcx, ExplicitReleaseFreesHeldBlocksOnce) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer")});
  const double free_before = prefiller.metric("tandem_kv_cache_free_blocks");
  const json params = prefill(prefiller, prompt_);
  EXPECT_EQ(prefiller.metric("tandem_kv_held_blocks"), 5);
  int status = 0;
  json answer = releaseOn(prefiller, params, &status);
  EXPECT_EQ(status, 200) << answer.dump();
  EXPECT_TRUE(eventually([&] {
    return prefiller.metric("tandem_kv_held_blocks") == 0 &&
           prefiller.metric("tandem_kv_cache_free_blocks") == free_before;
  }));
  answer = releaseOn(prefiller, params, &status);
  EXPECT_EQ(status, 404) << answer.dump();
  json other = prefill(prefiller, randomPrompt(40, 7));
  json foreign = other;
  foreign["remote_engine_id"] = "someone-else";
  answer = releaseOn(prefiller, foreign, &status);
  EXPECT_EQ(status, 404) << answer.dump();
  EXPECT_NE(answer.dump().find("names another agent"), std::string::npos) << answer.dump();
  answer = prefiller.post("/v1/kv_transfer/release", {{"transfer_id", "x"}}, &status);
  EXPECT_EQ(status, 400) << answer.dump();
  EXPECT_EQ(releaseOn(prefiller, other, &status)["released"], true);
}

TEST_P(KvUcx, SharedSecretSignsTransfersAndRefusesOthers) {
  const std::string alpha = R"({"secret":"alpha"})";
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer", json::parse(alpha))});
  ::setenv("TANDEM_KV_SECRET", "alpha", 1);  // the same secret, from the environment
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_consumer")});
  ::setenv("TANDEM_KV_SECRET", "beta", 1);
  Agent stranger({"--kv-transfer-config", ucxConfig("kv_consumer")});
  ::unsetenv("TANDEM_KV_SECRET");
  Agent unsigned_producer({"--kv-transfer-config", ucxConfig("kv_producer")});

  json params = prefill(prefiller, prompt_);
  ASSERT_TRUE(params.contains("signature")) << params.dump();
  EXPECT_EQ(params["signature"].get<std::string>().size(), 64u);

  int status = 0;
  json error = decode(stranger, prompt_, params, &status);
  EXPECT_EQ(status, 403) << error.dump();
  EXPECT_NE(error.dump().find("signature does not match"), std::string::npos) << error.dump();

  json tampered = params;
  std::swap(tampered["remote_block_ids"][0], tampered["remote_block_ids"][1]);
  error = decode(decoder, prompt_, tampered, &status);
  EXPECT_EQ(status, 403) << error.dump();

  json plain = prefill(unsigned_producer, prompt_);
  EXPECT_FALSE(plain.contains("signature"));
  error = decode(decoder, prompt_, plain, &status);
  EXPECT_EQ(status, 403) << error.dump();
  EXPECT_NE(error.dump().find("signature is missing"), std::string::npos) << error.dump();
  EXPECT_EQ(releaseOn(unsigned_producer, plain, &status)["released"], true);
  EXPECT_EQ(decoder.metric("tandem_kv_transfer_failures_total", "reason=\"auth\""), 2);
  EXPECT_EQ(stranger.metric("tandem_kv_transfer_failures_total", "reason=\"auth\""), 1);

  // A release must be signed too.
  json forged = params;
  forged["signature"] = std::string(64, '0');
  error = releaseOn(prefiller, forged, &status);
  EXPECT_EQ(status, 403) << error.dump();
  EXPECT_EQ(prefiller.metric("tandem_kv_held_blocks"), 5);

  // The right secret: the hand-off works and the signed release message
  // frees the prefill agent's blocks.
  Agent colocated;
  EXPECT_EQ(tokenIds(decode(decoder, prompt_, params)),
            tokenIds(colocated.post("/v1/completions", greedy(prompt_, 8))));
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 4);
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_held_blocks") == 0; }));
}

TEST_P(KvUcx, PullBackReadsEarlierTurnsFromTheDecodeAgent) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_both")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_both")});
  Agent colocated;
  // Turn 1 through the prefill and decode agents: 70 prompt tokens, 26 generated.
  const std::vector<int> turn1 = randomPrompt(70, 51);
  const std::vector<int> reply1 =
      tokenIds(decodeOn(decoder, turn1, prefillOn(prefiller, turn1), 26));
  ASSERT_EQ(reply1, tokenIds(colocated.post("/v1/completions", greedy(turn1, 26))));
  // Turn 2: the conversation so far and 40 new tokens (136).
  std::vector<int> turn2 = turn1;
  turn2.insert(turn2.end(), reply1.begin(), reply1.end());
  const std::vector<int> question = randomPrompt(40, 52);
  turn2.insert(turn2.end(), question.begin(), question.end());

  // The decode agent lends the 5 full blocks of turn 1 it computed or read
  // (95 computed tokens).
  int status = 0;
  json hold = decoder.post("/v1/kv_transfer/hold", {{"token_ids", turn2}}, &status);
  ASSERT_EQ(status, 200) << hold.dump();
  EXPECT_EQ(hold["num_tokens"], 80);
  EXPECT_EQ(decoder.metric("tandem_kv_held_blocks"), 5);

  // A prefill agent without turn 1 (another one was chosen, or it evicted
  // it) reads those blocks and computes only the rest.
  Agent fresh({"--kv-transfer-config", ucxConfig("kv_both")});
  json body = greedy(turn2, 1);
  body["kv_transfer_params"] = {{"do_remote_decode", true},
                                {"remote_prefix", hold["kv_transfer_params"]}};
  const double computed_before = fresh.metric("tandem_computed_tokens_total");
  json prefilled = fresh.post("/v1/completions", body);
  EXPECT_EQ(fresh.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 5);
  EXPECT_EQ(fresh.metric("tandem_computed_tokens_total") - computed_before, 136 - 80);
  EXPECT_TRUE(eventually([&] { return decoder.metric("tandem_kv_held_blocks") == 0; }))
      << "the reader's release frees the lent blocks";

  // The decode agent then reads only the blocks of turn 2 it lacks (8 - 5).
  const double decoder_loaded = decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\"");
  const std::vector<int> reply2 =
      tokenIds(decodeOn(decoder, turn2, prefilled["kv_transfer_params"]));
  EXPECT_EQ(decoder.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\"") - decoder_loaded, 3);
  EXPECT_EQ(reply2, tokenIds(colocated.post("/v1/completions", greedy(turn2, 8))));
  EXPECT_TRUE(eventually([&] { return fresh.metric("tandem_kv_held_blocks") == 0; }));
}

TEST_P(KvUcx, PullBackBelowTheThresholdRecomputesAndLetsTheLenderGo) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_both")});
  Agent decoder({"--kv-transfer-config", ucxConfig("kv_both")});
  const std::vector<int> prompt = randomPrompt(60, 53);  // 3 full blocks cached
  decoder.post("/v1/completions", greedy(prompt, 4));
  int status = 0;
  json hold = decoder.post("/v1/kv_transfer/hold", {{"token_ids", prompt}}, &status);
  ASSERT_EQ(status, 200) << hold.dump();
  EXPECT_EQ(hold["num_tokens"], 48);
  json body = greedy(prompt, 1);
  body["kv_transfer_params"] = {{"do_remote_decode", true},
                                {"remote_prefix", hold["kv_transfer_params"]}};
  const double computed_before = prefiller.metric("tandem_computed_tokens_total");
  json prefilled = prefiller.post("/v1/completions", body);
  EXPECT_EQ(prefiller.metric("tandem_kv_blocks_loaded_total", "source=\"ucx\""), 0)
      << "3 blocks are below remote_pull_threshold (4)";
  EXPECT_EQ(prefiller.metric("tandem_computed_tokens_total") - computed_before, 60);
  EXPECT_TRUE(eventually([&] { return decoder.metric("tandem_kv_held_blocks") == 0; }))
      << "a declined prefix is released at once, not at the hold timeout";
  EXPECT_EQ(releaseOn(prefiller, prefilled["kv_transfer_params"])["released"], true);
}

TEST_P(KvUcx, HoldRequestsAreCheckedNamingTheField) {
  Agent lender({"--kv-transfer-config", ucxConfig("kv_both")});
  Agent consumer({"--kv-transfer-config", ucxConfig("kv_consumer")});
  int status = 0;
  json error = lender.post("/v1/kv_transfer/hold", {{"token_ids", randomPrompt(40, 54)}}, &status);
  EXPECT_EQ(status, 404) << error.dump();
  EXPECT_NE(error.dump().find("no leading block of the prompt is cached"), std::string::npos);
  error = lender.post("/v1/kv_transfer/hold", {{"token_ids", {1, -2}}}, &status);
  EXPECT_EQ(status, 400) << error.dump();
  EXPECT_EQ(error["error"]["param"], "token_ids");
  error = lender.post("/v1/kv_transfer/hold", {{"token_ids", {1, 2}}, {"cache_salt", 3}}, &status);
  EXPECT_EQ(status, 400) << error.dump();
  error = consumer.post("/v1/kv_transfer/hold", {{"token_ids", randomPrompt(40, 54)}}, &status);
  EXPECT_EQ(status, 400) << error.dump();
  EXPECT_NE(error.dump().find("kv_role kv_producer or kv_both"), std::string::npos);
}

TEST(KvUcxStart, ProducerOnANonLoopbackAddressNeedsASecret) {
  TempDir logs("tandem-kv-secret");
  auto start = [&](std::vector<std::string> extra,
                   const std::string& config = ucxConfig("kv_producer")) {
    return startOnAllAddresses(logs.path(), config, extra);
  };
  auto refused = start({});
  EXPECT_EQ(refused->wait(std::chrono::seconds(30)), 1);
  EXPECT_NE(refused->stderrText().find("set a shared secret"), std::string::npos)
      << refused->stderrText();
  EXPECT_NE(refused->stderrText().find("--insecure-kv"), std::string::npos);
  // On a wildcard address the producer must be told what address to give
  // readers: advertise_host, else POD_IP.
  auto nowhere = start({"--insecure-kv"});
  EXPECT_EQ(nowhere->wait(std::chrono::seconds(30)), 1);
  EXPECT_NE(nowhere->stderrText().find("set kv_connector_extra_config.advertise_host or the "
                                       "POD_IP environment variable"),
            std::string::npos)
      << nowhere->stderrText();
  ::setenv("POD_IP", "127.0.0.1", 1);
  auto insecure = start({"--insecure-kv"});
  ::unsetenv("POD_IP");
  EXPECT_FALSE(insecure->waitForLine("listening on ", std::chrono::seconds(60)).empty())
      << insecure->stderrText();
  ::setenv("TANDEM_KV_SECRET", "gamma", 1);
  auto secured = start({}, ucxConfig("kv_producer", {{"advertise_host", "127.0.0.1"}}));
  ::unsetenv("TANDEM_KV_SECRET");
  EXPECT_FALSE(secured->waitForLine("listening on ", std::chrono::seconds(60)).empty())
      << secured->stderrText();
}

TEST_P(KvUcx, HeldBlocksAreFreedWhenNoReaderComes) {
  Agent prefiller({"--kv-transfer-config", ucxConfig("kv_producer", {{"abort_timeout_s", 0.2}})});
  json params = prefill(prefiller, prompt_);
  ASSERT_TRUE(params.is_object());
  EXPECT_TRUE(eventually([&] { return prefiller.metric("tandem_kv_cache_usage_ratio") == 0; }))
      << "the hold must time out";
}

INSTANTIATE_TEST_SUITE_P(Transports, KvUcx, ::testing::Values("sm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
