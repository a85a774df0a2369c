// Memory that a command can tell it will need before allocating it — a model file's tensors,
// a new model's parameters, training's weights + gradients + Adam moments — is checked against
// a limit: the machine's physical memory, or --max-memory. A stranger's file or config that
// declares more is refused with a clear error instead of being allocated until the OOM killer.
#pragma once

#include <cstdint>
#include <string>

namespace tfm {

// 0 restores the default: the machine's physical memory.
void set_memory_limit(int64_t bytes);
int64_t memory_limit();

// Throws Error("<what> needs N GiB, more than the M GiB ...") when bytes exceed the limit.
void check_memory(int64_t bytes, const std::string& what);

// This process's resident memory now, in bytes (0 where /proc is unavailable).
int64_t resident_memory_bytes();

// "8G", "512M", "1.5G", "1048576" (bytes) → bytes; throws Error on anything else.
int64_t parse_memory_size(const std::string& text);

// glibc hands large freed blocks (mmap'd, ≥ 128 KiB by default) straight back to the system,
// so each translation batch's fresh workspaces page-fault and zero again: the encoder of a
// 32-sentence base batch took 0.33 s that way against 0.13 s in reused memory. Called once at
// program start, this keeps freed memory in the process for the next batch (peak RSS is what
// the largest batch needs, as before).
void retain_freed_memory();

// Returns the freed memory retain_freed_memory keeps to the system now: for memory that is
// done with for good, such as what loading and preparing a model for inference freed
// (Model::prepared, once the weights are packed: 20-25 MB of base's int8 RSS).
void release_freed_memory();

// Makes every thread allocate from at most `heaps` heaps (glibc's arenas; by default up to 8
// per core, one per thread that ever allocated). What retain_freed_memory keeps is kept per
// heap, and release_freed_memory cannot return the top of a thread's heap: a server whose
// many request threads each tokenized one large text kept ~40 MB per thread (1.3 GB after 32
// refused 900 KB requests; 25 MB with 2 heaps). Call before the threads start.
void limit_heaps(int heaps);

}  // namespace tfm
