# Shared compile settings and the helper that turns a source directory into a library plus its tests.

set(PD_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align -Wunused -Woverloaded-virtual
    -Wimplicit-fallthrough)
if(PD_WERROR)
  list(APPEND PD_WARNINGS -Werror)
endif()

if(PD_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

# pd_library(NAME DIR DEPS... PRIVATE_DEPS... TEST_DEPS...): every *.cpp in DIR except *_test.cpp /
# *_bench.cpp becomes library NAME; every *_test.cpp becomes part of the test binary NAME_tests, registered
# with ctest (label "unit"). DEPS are what the library's headers expose (PUBLIC); PRIVATE_DEPS are used by
# its sources only (a static library still passes them on to the final link).
function(pd_library name dir)
  cmake_parse_arguments(PD "" "" "DEPS;PRIVATE_DEPS;TEST_DEPS" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${dir}/*.cpp)
  file(GLOB tests CONFIGURE_DEPENDS ${dir}/*_test.cpp)
  file(GLOB benches CONFIGURE_DEPENDS ${dir}/*_bench.cpp)
  list(REMOVE_ITEM srcs ${tests} ${benches} "")
  if(srcs)
    add_library(${name} STATIC ${srcs})
    target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${PD_WARNINGS}>)
    target_link_libraries(${name} PUBLIC ${PD_DEPS} PRIVATE ${PD_PRIVATE_DEPS})
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(${name} INTERFACE ${PD_DEPS})
  endif()
  if(tests)
    add_executable(${name}_tests ${tests})
    target_compile_options(${name}_tests PRIVATE ${PD_WARNINGS})
    target_compile_definitions(${name}_tests PRIVATE PD_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
    target_link_libraries(${name}_tests PRIVATE ${name} ${PD_TEST_DEPS} GTest::gtest GTest::gtest_main)
    add_test(NAME ${name} COMMAND ${name}_tests WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(${name} PROPERTIES LABELS unit)
  endif()
endfunction()

# pd_test(NAME SOURCES... DEPS ... LABEL L): a test binary outside src/ (golden, exactness, ...).
function(pd_test name)
  cmake_parse_arguments(PD "" "LABEL" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${PD_SOURCES})
  target_compile_options(${name} PRIVATE ${PD_WARNINGS})
  target_compile_definitions(${name} PRIVATE PD_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  target_link_libraries(${name} PRIVATE ${PD_DEPS} GTest::gtest GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  if(PD_LABEL)
    set_tests_properties(${name} PROPERTIES LABELS ${PD_LABEL})
  endif()
endfunction()
