# A kernel source of kernels/cuda/ as host C++ for the CUDA emulator
# (docs/cuda.md#the-emulator): `kernel<<<grid, block, shared, stream>>>(args)`
# becomes `kernel << Launch(grid, block, shared, stream)(args)`, an
# `extern __shared__` array a pointer to the block's dynamic shared memory,
# and each other `__shared__` declaration is followed by a call that lets
# the emulator fill it with all-ones bytes for each block.
# Everything else compiles as it is, with device.h and instructions.h
# force-included. Usage: cmake -DIN=<file.cu> -DOUT=<file.cpp> -P translate.cmake
file(READ "${IN}" text)
string(REPLACE "<<<" " << ::tandem::cuda_emu::Launch(" text "${text}")
string(REPLACE ">>>" ")" text "${text}")
string(REGEX REPLACE
  "extern __shared__ (__align__\\([0-9]+\\) )?([A-Za-z0-9_]+) ([A-Za-z0-9_]+)\\[\\];"
  "\\2* \\3 = ::tandem::cuda_emu::dynamicShared<\\2>();" text "${text}")
# Each static __shared__ object is announced to the emulator where it is
# declared, so that every block finds it filled with all-ones bytes.
string(REGEX REPLACE
  "(__shared__ (__align__\\([0-9]+\\) )?[^;{}()]* ([A-Za-z_][A-Za-z0-9_]*)(\\[[^];]*\\])*;)"
  "\\1 ::tandem::cuda_emu::sharedVariable(\\3, sizeof(\\3));" text "${text}")
if(text MATCHES "extern __shared__")
  message(FATAL_ERROR "${IN}: an extern __shared__ declaration translate.cmake does not know")
endif()
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${text}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
