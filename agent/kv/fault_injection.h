// Fault injection for KV transfers, for tests only: off unless the agent is
// started with --enable-fault-injection, configured as
// kv_connector_extra_config.fault_injection, e.g.
//   {"drop_blocks": "growing_gaps"}            blocks 1, 4-5, 9-11, ... fail
//   {"drop_blocks": "every_nth:3"}             blocks 2, 5, 8, ... fail
//   {"drop_blocks": "all"}                     every block fails
//   {"fail_handshake": true}                   every load fails as if the
//                                              peer refused the connection
//   {"drop_notifications": true}               ucx: no release message sent
//   {"delay_notifications_ms": 200}            ucx: release sent late
//   {"fail_staging_copies": "out"}             ucx, kv_buffer staging: each
//                                              copy between the KV cache and
//                                              the staging area throws, as a
//                                              failing device copy would:
//                                              "out" (cache to staging, a
//                                              lender's), "in" (staging to
//                                              cache, a reader's) or "both"
//   {"throw_on_lookup": "boom"}                the lookup of a request whose
//                                              id contains "boom" throws (as a
//                                              broken connector or device
//                                              would, inside an engine step)
//
// growing_gaps follows vLLM's segmented-prefill example: over a request's
// block indices, valid segments and gaps alternate with lengths 1, 1, 2, 2,
// 3, 3, ... (valid first), and the request's last loadable block is never a
// gap. A dropped block is reported failed after the connector's load (its
// bytes are then recomputed over), with failure reason "injected".
//
// FaultInjectingConnector wraps any connector and applies drop_blocks and
// fail_handshake; notification faults are applied by the ucx connector,
// which reads them with FaultInjection::parse. Thread-safety: as the wrapped
// connector.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "agent/kv/connector.h"

namespace tandem::kv {

struct FaultInjection {
  enum class Drop { kNone, kGrowingGaps, kEveryNth, kAll };
  Drop drop = Drop::kNone;
  int64_t every_nth = 0;
  bool fail_handshake = false;
  bool drop_notifications = false;
  int64_t delay_notifications_ms = 0;
  bool fail_copies_out = false;                // KV cache -> staging area
  bool fail_copies_in = false;                 // staging area -> KV cache
  std::optional<std::string> throw_on_lookup;  // a request id substring

  bool any() const {
    return drop != Drop::kNone || fail_handshake || drop_notifications ||
           delay_notifications_ms > 0 || fail_copies_out || fail_copies_in ||
           throw_on_lookup.has_value();
  }
  // Whether block `index` of a request whose loadable blocks are
  // [0, num_blocks) is dropped.
  bool drops(int64_t index, int64_t num_blocks) const;

  // Reads extra["fault_injection"] (absent: no faults). InvalidArgument names
  // the field and what is accepted.
  static StatusOr<FaultInjection> parse(const nlohmann::json& extra);
};

// The faults a connector's extra config asks for; throws tandem::Error when
// fault_injection is malformed, or configured while `enabled`
// (--enable-fault-injection) is false. `tandem-agent serve` calls it before
// it allocates anything (a refusal comes at once, not after a KV slab of
// gigabytes is set up); withFaultInjection calls it again.
FaultInjection checkFaultInjection(const nlohmann::json& extra, bool enabled);

// Wraps `inner` (over a KV cache of `block_size` tokens per block) with the
// configured faults; throws as checkFaultInjection does. Returns `inner`
// untouched without faults.
std::unique_ptr<KvConnector> withFaultInjection(std::unique_ptr<KvConnector> inner, bool enabled,
                                                int64_t block_size);

}  // namespace tandem::kv
