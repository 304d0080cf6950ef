# Cross-building ferry for 64-bit Windows from Debian with mingw-w64 (the posix thread model, for
# std::thread): cmake -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-mingw64.cmake ...
# Tests run under Wine (CMAKE_CROSSCOMPILING_EMULATOR). The header-only dependencies Debian
# installs for Linux (nlohmann-json, CLI11, xxHash) serve the Windows build too, but /usr/include
# must never reach the compiler (glibc's headers would shadow mingw's): they are linked into a
# small prefix of their own, the only place besides mingw's sysroot that find_* searches.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(CMAKE_C_COMPILER x86_64-w64-mingw32-gcc-posix)
set(CMAKE_CXX_COMPILER x86_64-w64-mingw32-g++-posix)
set(CMAKE_RC_COMPILER x86_64-w64-mingw32-windres)

find_program(FERRY_WINE NAMES wine64 wine PATHS /usr/lib/wine)
if(FERRY_WINE)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${FERRY_WINE})
endif()

set(_ferry_deps ${CMAKE_BINARY_DIR}/mingw-header-deps)
file(MAKE_DIRECTORY ${_ferry_deps}/include ${_ferry_deps}/share/cmake)
foreach(_item include/nlohmann include/CLI include/xxhash.h include/xxh3.h
              share/cmake/nlohmann_json share/cmake/CLI11)
  if(EXISTS /usr/${_item} AND NOT EXISTS ${_ferry_deps}/${_item})
    file(CREATE_LINK /usr/${_item} ${_ferry_deps}/${_item} SYMBOLIC)
  endif()
endforeach()

set(CMAKE_FIND_ROOT_PATH /usr/x86_64-w64-mingw32 ${_ferry_deps})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# GoogleTest is built from the sources Debian's libgtest-dev installs (tests/CMakeLists.txt).
set(FERRY_GTEST_SOURCE_DIR /usr/src/googletest CACHE PATH "GoogleTest sources for cross builds")
# One self-contained set of .exe/.dll files: no libstdc++/libgcc/winpthread DLLs to carry.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-static")
