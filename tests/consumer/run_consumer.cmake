# cmake -DMODE=find_package|add_subdirectory -DDAPO_SOURCE_DIR=... -DDAPO_BINARY_DIR=... -DWORK_DIR=... [-DLAUNCHER=...]
#   -P this
# Installs dapo (find_package mode), configures, builds and runs the consumer project; fails on any error.
function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer (${MODE}): ${what} failed with ${rc}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
if(MODE STREQUAL "find_package")
  run_step("cmake --install" ${CMAKE_COMMAND} --install ${DAPO_BINARY_DIR} --prefix ${WORK_DIR}/prefix)
  set(extra_args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
  if(NOT EXISTS ${WORK_DIR}/prefix/share/dapo/dapo_cuda.cu)  # what the cuda component compiles
    message(FATAL_ERROR "consumer (${MODE}): share/dapo/dapo_cuda.cu was not installed")
  endif()
else()
  set(extra_args -DDAPO_SOURCE_DIR=${DAPO_SOURCE_DIR})
endif()
# The compiler launcher of dapo's own build (ccache in scripts/setup.sh), so that an unchanged consumer is not
# compiled again on every run.
if(LAUNCHER)
  list(APPEND extra_args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
run_step("configure" ${CMAKE_COMMAND} -S ${DAPO_SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build
         -DDAPO_CONSUMER_MODE=${MODE} -DCMAKE_BUILD_TYPE=Release ${extra_args})
run_step("build" ${CMAKE_COMMAND} --build ${WORK_DIR}/build -j2)
run_step("core_consumer" ${WORK_DIR}/build/core_consumer)
run_step("torch_consumer" ${WORK_DIR}/build/torch_consumer)
