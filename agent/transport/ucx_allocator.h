// A KvSlabAllocator whose memory UCX allocates and registers itself.
//
// The KV slab of an agent that serves reads must come from here: memory from
// ucp_mem_map(UCP_MEM_MAP_ALLOCATE) is shared-memory backed where UCX can
// (posix/sysv), so peers on the same host read it one-sidedly without the
// owner's help, whereas registered malloc memory is served by slow message
// emulation. The allocator also supplies what peers need to read the slab
// (remoteSlab) and what local reads write into (localSlab).
//
// On a backend whose memory the host cannot touch (bindBackend with a CUDA
// backend), the slab is that backend's memory, registered with UCX in place
// (ucp_mem_map of the address, memory type CUDA): only for a UCX whose
// memory types include cuda (UcxContext::supportsCudaMemory), so that peers
// read device memory directly (cuda_ipc on one host, GPUDirect RDMA across).
//
// One slab at a time: allocate() again before release() returns nullptr.
// Keeps its UcxContext alive. allocate()/release() belong to start-up and
// shutdown (one thread); the const accessors may be called from any thread
// once allocate() has returned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "agent/engine/kv_cache.h"
#include "agent/transport/remote_slab.h"
#include "agent/transport/ucx_transport.h"
#include "common/status.h"

namespace tandem::transport {

class UcxSlabAllocator : public engine::KvSlabAllocator {
 public:
  explicit UcxSlabAllocator(std::shared_ptr<UcxContext> context);
  const std::shared_ptr<UcxContext>& context() const { return context_; }
  // Unmaps a slab that was never released.
  ~UcxSlabAllocator() override;
  UcxSlabAllocator(const UcxSlabAllocator&) = delete;
  UcxSlabAllocator& operator=(const UcxSlabAllocator&) = delete;

  // Zero-filled, committed, page-aligned memory from ucp_mem_map(ALLOCATE), or nullptr
  // (with a log line saying why).
  void* allocate(size_t bytes) override;
  void release(void* data, size_t bytes) override;
  std::string name() const override { return device_ != nullptr ? "ucx-device" : "ucx"; }
  // Host slabs are shared memory, committed at once (commitHostSlab).
  std::optional<bool> commitsHostMemory() const override {
    return device_ != nullptr ? std::nullopt : std::optional<bool>(true);
  }
  void bindBackend(kernels::Backend& backend) override;

  // Valid between allocate() and release(); nullptr / 0 / "" otherwise.
  uint8_t* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  const std::string& packedRkey() const { return packed_rkey_; }
  ucp_mem* memoryHandle() const { return memory_; }

  // The slab cut into blocks of `block_bytes` (as many as fit), as a read
  // destination and as the descriptor peers connect to. FailedPrecondition
  // before allocate(), InvalidArgument when not even one block fits.
  StatusOr<LocalSlab> localSlab(uint64_t block_bytes) const;
  StatusOr<RemoteSlab> remoteSlab(uint64_t block_bytes) const;

 private:
  std::shared_ptr<UcxContext> context_;
  ucp_mem* memory_ = nullptr;
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  std::string packed_rkey_;
  kernels::Backend* device_ = nullptr;  // set when the slab is device memory
};

}  // namespace tandem::transport
