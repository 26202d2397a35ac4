# DAPO_TORCH_LIBRARIES: what dapo's LibTorch targets link, ${TORCH_LIBRARIES} preceded, where the C++ runtime is
# libstdc++ on Linux, by an item that names that runtime (libstdc++.so.6, then libgcc_s.so.1) before LibTorch's
# libraries. Included after find_package(Torch) by dapo's CMakeLists.txt and by the installed dapoConfig.cmake, so
# that every program and module linking dapo::torch, ours or a consumer's, gets it.
#
# Why: pip's LibTorch is built with a GCC toolset that links the parts of libstdc++ newer than its base system's
# statically (libstdc++_nonshared.a) and exports them, unversioned: libtorch_cpu.so defines 142 std::filesystem
# functions, PyTorch 2.11's libtorch.so std::filesystem::remove_all and other operations too, libtorch.so and
# libc10.so std::basic_stringbuf members. The compiler driver adds -lstdc++ at the end of the link line, so a
# program's DT_NEEDED listed libtorch*.so before libstdc++.so.6, and the dynamic linker, which takes the first
# definition in that breadth-first order, bound our own calls to torch's copies (LD_DEBUG=bindings shows it). Those
# copies are not whole: 2.11's remove_all in libtorch.so reaches recursive_directory_iterator's constructor,
# destructor and __erase through undefined weak symbols (PyTorch weakens them in the toolset's archive), which no
# library defines, so it called address 0: a SIGSEGV in every ScratchDir's destructor and in the checkpoint writer's
# removal of old checkpoints. With the runtime named first, our references bind to the libstdc++ our headers belong
# to; LibTorch's own code resolves as before. Harmless elsewhere (Debian's LibTorch exports no such copies): the
# runtime is linked anyway, only earlier. Sanitizer runtimes stay first (the compiler driver puts them before this).
set(DAPO_TORCH_LIBRARIES ${TORCH_LIBRARIES})
if(CMAKE_SYSTEM_NAME STREQUAL "Linux" AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  if(NOT DEFINED DAPO_STDCXX_FIRST)
    include(CheckCXXSourceCompiles)
    include(CheckLinkerFlag)
    check_cxx_source_compiles("#include <cstddef>\n#ifndef __GLIBCXX__\n#error not libstdc++\n#endif\nint main() {}"
                              DAPO_HAVE_LIBSTDCXX)
    if(DAPO_HAVE_LIBSTDCXX)
      check_linker_flag(CXX "LINKER:--push-state,--no-as-needed,-lstdc++,-lgcc_s,--pop-state" DAPO_HAVE_STDCXX_FIRST)
    endif()
    # --push-state keeps the link line's --as-needed setting (LibTorch's targets switch it) as it was.
    if(DAPO_HAVE_STDCXX_FIRST)
      set(DAPO_STDCXX_FIRST "-Wl,--push-state,--no-as-needed,-lstdc++,-lgcc_s,--pop-state" CACHE INTERNAL
          "link item naming the C++ runtime before LibTorch (dapoTorchLibraries.cmake)")
    else()
      set(DAPO_STDCXX_FIRST "" CACHE INTERNAL "link item naming the C++ runtime before LibTorch (none here)")
    endif()
  endif()
  if(DAPO_STDCXX_FIRST)
    list(PREPEND DAPO_TORCH_LIBRARIES "${DAPO_STDCXX_FIRST}")
  endif()
endif()
