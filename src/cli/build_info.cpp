// `transformer --version` (see build_info.h).
#include "cli/build_info.h"

#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "backend/backend.h"
#include "model/config.h"

#ifndef TRANSFORMER_VERSION
#error "TRANSFORMER_VERSION comes from CMake's project(VERSION)"
#endif

namespace tfm {

namespace {

std::string joined(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& word : words) text += (text.empty() ? "" : " ") + word;
  return text.empty() ? "none of the extensions below" : text;
}

// The x86 extensions this translation unit was compiled for (the whole build shares its flags).
std::string compiled_instruction_sets() {
  std::vector<std::string> sets;
#ifdef __AVX2__
  sets.push_back("AVX2");
#endif
#ifdef __FMA__
  sets.push_back("FMA");
#endif
#ifdef __AVX512F__
  sets.push_back("AVX-512");
#endif
#ifdef __AVX512BF16__
  sets.push_back("AVX512-BF16");
#endif
#ifdef __AVX512VNNI__
  sets.push_back("AVX512-VNNI");
#endif
#ifdef __AVXVNNI__
  sets.push_back("AVX-VNNI");
#endif
#ifdef __AMX_TILE__
  sets.push_back("AMX");
#endif
  return joined(sets);
}

// The same extensions as this CPU reports them.
std::string cpu_instruction_sets() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  std::vector<std::string> sets;
  if (__builtin_cpu_supports("avx2")) sets.push_back("AVX2");
  if (__builtin_cpu_supports("fma")) sets.push_back("FMA");
  if (__builtin_cpu_supports("avx512f")) sets.push_back("AVX-512");
  if (__builtin_cpu_supports("avx512bf16")) sets.push_back("AVX512-BF16");
  if (__builtin_cpu_supports("avx512vnni")) sets.push_back("AVX512-VNNI");
  // AVX-VNNI and AMX-BF16 by CPUID leaf 7 (subleaf 1 EAX bit 4; subleaf 0 EDX bit 22): clang
  // 14's __builtin_cpu_supports does not know their names.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4)))
    sets.push_back("AVX-VNNI");
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx & (1u << 22))) sets.push_back("AMX");
  return joined(sets);
#else
  return "not an x86 CPU";
#endif
}

}  // namespace

std::string build_description() {
  std::string text = std::string("transformer ") + TRANSFORMER_VERSION + "\n";
  text += std::string("model file format: ") + kModelFormatName + "/" +
          std::to_string(kModelFormatVersion) + "\n";
  text += "backends: " + joined(built_backend_kinds());
#ifdef TRANSFORMER_CUDA_VERSION
  text += std::string(" (CUDA ") + TRANSFORMER_CUDA_VERSION + ")";
#endif
  text += "\n";
#ifdef TRANSFORMER_WITH_MPI
  text += "MPI: yes (train under mpirun)\n";
#else
  text += "MPI: no\n";
#endif
  text += "compiled for: x86-64 " + compiled_instruction_sets() +
          " (AVX-512 kernels chosen at run time where this CPU has them)\n";
  text += "this CPU: " + cpu_instruction_sets();
  return text;
}

}  // namespace tfm
