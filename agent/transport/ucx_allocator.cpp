#include "agent/transport/ucx_allocator.h"

#include <sys/mman.h>
#include <ucp/api/ucp.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

#include "common/logging.h"

#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer's dynamic annotation (defined by libtsan).
extern "C" void AnnotateBenignRaceSized(const char* file, int line, const volatile void* memory,
                                        long size, const char* description);
#endif

namespace tandem::transport {
namespace {

// Commits a host slab's pages now, so that a slab the machine cannot hold
// fails at start rather than mid-serving, and leaves it zero-filled. Memory
// fresh from the kernel (`fresh`) is already zero: MADV_POPULATE_WRITE
// (Linux 5.14) faults its pages in as a write to each would, without
// writing, an order of magnitude faster than memset over shared memory
// (docs/kv-transfer.md). Other memory, and kernels without it (EINVAL), get
// the memset. ResourceExhausted, naming the error, where the kernel cannot
// back the pages (a POSIX shared-memory slab larger than /dev/shm: the
// memset would have died of SIGBUS).
Status commitHostSlab(uint8_t* base, size_t bytes, bool fresh) {
  // Huge pages where the kernel gives them for this memory (fewer TLB misses
  // in attention); a refusal is harmless.
  ::madvise(base, bytes, MADV_HUGEPAGE);
  if (fresh) {
    if (::madvise(base, bytes, MADV_POPULATE_WRITE) == 0) return Status::ok();
    const int error = errno;
    if (error != EINVAL) {
      return resourceExhausted("cannot commit the " + std::to_string(bytes) +
                               "-byte KV slab: " + std::strerror(error) +
                               " (a shared-memory slab needs as much room in /dev/shm)");
    }
    static std::once_flag logged;
    std::call_once(logged, [] {
      TANDEM_LOG(kInfo) << "this kernel cannot populate memory (MADV_POPULATE_WRITE, Linux "
                           "5.14): the KV slab is zeroed with writes";
    });
  }
  std::memset(base, 0, bytes);
  return Status::ok();
}

}  // namespace

UcxSlabAllocator::UcxSlabAllocator(std::shared_ptr<UcxContext> context)
    : context_(std::move(context)) {
  TANDEM_CHECK(context_ != nullptr, "UcxSlabAllocator needs a UcxContext");
}

UcxSlabAllocator::~UcxSlabAllocator() {
  if (memory_ != nullptr) release(base_, bytes_);
}

void UcxSlabAllocator::bindBackend(kernels::Backend& backend) {
  device_ = backend.hostAccessible() ? nullptr : &backend;
}

void* UcxSlabAllocator::allocate(size_t bytes) {
  if (memory_ != nullptr) {
    TANDEM_LOG(kError) << "the UCX slab allocator holds one slab at a time";
    return nullptr;
  }
  if (bytes == 0) return nullptr;
  if (device_ != nullptr && !context_->supportsCudaMemory()) {
    TANDEM_LOG(kError) << "this UCX cannot register device memory (its memory types lack cuda); "
                          "the KV slab of a device backend needs kv_buffer \"staging\"";
    return nullptr;
  }
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.length = bytes;
  void* device_memory = nullptr;
  if (device_ != nullptr) {
    // The backend's (zero-filled) memory, registered in place.
    device_memory = device_->allocate(bytes);
    if (device_memory == nullptr) {
      TANDEM_LOG(kError) << "the " << kernels::deviceKindName(device_->kind())
                         << " backend cannot allocate a " << bytes << "-byte KV slab";
      return nullptr;
    }
    params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.address = device_memory;
    params.memory_type = UCS_MEMORY_TYPE_CUDA;
  } else {
    params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    params.address = nullptr;
    params.flags = UCP_MEM_MAP_ALLOCATE;
  }
  auto give_back_device_memory = [&] {
    if (device_memory != nullptr) device_->release(device_memory, bytes);
  };
  ucp_mem_h memory = nullptr;
  ucs_status_t status = ucp_mem_map(context_->context_, &params, &memory);
  if (status != UCS_OK) {
    TANDEM_LOG(kError) << "UCX cannot " << (device_memory != nullptr ? "register" : "allocate")
                       << " a " << bytes << "-byte slab: " << ucs_status_string(status);
    give_back_device_memory();
    return nullptr;
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  status = ucp_mem_query(memory, &attr);
  if (status != UCS_OK || attr.length < bytes ||
      reinterpret_cast<uintptr_t>(attr.address) % 64 != 0) {
    TANDEM_LOG(kError) << "UCX returned an unusable slab for " << bytes << " bytes";
    ucp_mem_unmap(context_->context_, memory);
    give_back_device_memory();
    return nullptr;
  }
  // Device memory came zero-filled from the backend.
  if (device_memory == nullptr) {
    Status committed =
        commitHostSlab(static_cast<uint8_t*>(attr.address), bytes, context_->allocationsAreFresh());
    if (!committed.isOk()) {
      TANDEM_LOG(kError) << committed.message();
      ucp_mem_unmap(context_->context_, memory);
      return nullptr;
    }
  }
  void* packed = nullptr;
  size_t packed_size = 0;
  status = ucp_rkey_pack(context_->context_, memory, &packed, &packed_size);
  if (status != UCS_OK) {
    TANDEM_LOG(kError) << "UCX cannot pack a remote key for the slab: "
                       << ucs_status_string(status);
    ucp_mem_unmap(context_->context_, memory);
    give_back_device_memory();
    return nullptr;
  }
  packed_rkey_.assign(static_cast<const char*>(packed), packed_size);
  ucp_rkey_buffer_release(packed);

  memory_ = memory;
  base_ = static_cast<uint8_t*>(attr.address);
  bytes_ = bytes;
#if defined(__SANITIZE_THREAD__)
  // Over TCP the progress thread copies slab bytes out for a reader in
  // another process, ordered after the writer by messages through that
  // process, which ThreadSanitizer cannot see.
  AnnotateBenignRaceSized(__FILE__, __LINE__, base_, static_cast<long>(bytes_),
                          "KV slab served to peers through UCX");
#endif
  return base_;
}

void UcxSlabAllocator::release(void* data, size_t bytes) {
  TANDEM_CHECK(memory_ != nullptr && data == base_, "releasing memory this allocator did not give");
  ucs_status_t status = ucp_mem_unmap(context_->context_, memory_);
  if (status != UCS_OK) {
    TANDEM_LOG(kWarn) << "UCX failed to unmap the KV slab: " << ucs_status_string(status);
  }
  if (device_ != nullptr) device_->release(base_, bytes_);  // registered in place: ours to free
  memory_ = nullptr;
  base_ = nullptr;
  bytes_ = 0;
  packed_rkey_.clear();
}

StatusOr<LocalSlab> UcxSlabAllocator::localSlab(uint64_t block_bytes) const {
  if (memory_ == nullptr) return failedPrecondition("the UCX slab is not allocated");
  if (block_bytes == 0 || block_bytes > bytes_) {
    return invalidArgument("block size must be between 1 and the slab's " + std::to_string(bytes_) +
                           " bytes, got " + std::to_string(block_bytes));
  }
  LocalSlab slab;
  slab.base = base_;
  slab.block_bytes = block_bytes;
  slab.num_blocks = static_cast<int64_t>(bytes_ / block_bytes);
  slab.memory_handle = memory_;
  return slab;
}

StatusOr<RemoteSlab> UcxSlabAllocator::remoteSlab(uint64_t block_bytes) const {
  StatusOr<LocalSlab> local = localSlab(block_bytes);
  if (!local.isOk()) return local.status();
  RemoteSlab slab;
  slab.worker_address = context_->workerAddress();
  slab.packed_rkey = packed_rkey_;
  slab.base_address = reinterpret_cast<uint64_t>(base_);
  slab.block_bytes = block_bytes;
  slab.num_blocks = local->num_blocks;
  return slab;
}

}  // namespace tandem::transport
