# cmake -P script behind the `cmake_consumer` test: install the resilience build tree into a scratch
# prefix, then configure, build and run tests/cmake_consumer against that prefix.
#
# Inputs (-D): RESILIENCE_BINARY_DIR, CONSUMER_SOURCE_DIR, CONSUMER_PREFIX, CONSUMER_BINARY_DIR,
#              CONSUMER_CONFIG, CONSUMER_GENERATOR, CONSUMER_MAKE_PROGRAM, CONSUMER_CXX_COMPILER,
#              CONSUMER_CXX_COMPILER_LAUNCHER, CONSUMER_REQUEST (the version to ask for) (the last six may
#              be empty).
cmake_minimum_required(VERSION 3.21)

foreach(var RESILIENCE_BINARY_DIR CONSUMER_SOURCE_DIR CONSUMER_PREFIX CONSUMER_BINARY_DIR)
    if(NOT ${var})
        message(FATAL_ERROR "run.cmake: -D${var}=... is required")
    endif()
endforeach()

function(run_step what)
    message(STATUS "cmake_consumer: ${what}")
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE result COMMAND_ECHO STDOUT)
    if(NOT result EQUAL 0)
        message(FATAL_ERROR "cmake_consumer: ${what} failed (${result})")
    endif()
endfunction()

# Start clean: a stale prefix or cache would hide a packaging regression.
file(REMOVE_RECURSE "${CONSUMER_PREFIX}" "${CONSUMER_BINARY_DIR}")

set(config_args)
if(CONSUMER_CONFIG)
    set(config_args --config "${CONSUMER_CONFIG}")
endif()

run_step("install into ${CONSUMER_PREFIX}"
    "${CMAKE_COMMAND}" --install "${RESILIENCE_BINARY_DIR}" --prefix "${CONSUMER_PREFIX}" ${config_args})

set(configure_args
    -S "${CONSUMER_SOURCE_DIR}" -B "${CONSUMER_BINARY_DIR}"
    "-DCMAKE_PREFIX_PATH=${CONSUMER_PREFIX}"
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(CONSUMER_GENERATOR)
    list(APPEND configure_args -G "${CONSUMER_GENERATOR}")
endif()
if(CONSUMER_MAKE_PROGRAM)
    list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${CONSUMER_MAKE_PROGRAM}")
endif()
if(CONSUMER_CXX_COMPILER)
    list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CONSUMER_CXX_COMPILER}")
endif()
if(CONSUMER_CXX_COMPILER_LAUNCHER)
    list(APPEND configure_args "-DCMAKE_CXX_COMPILER_LAUNCHER=${CONSUMER_CXX_COMPILER_LAUNCHER}")
endif()
if(CONSUMER_CONFIG)
    list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${CONSUMER_CONFIG}")
endif()
if(CONSUMER_REQUEST)
    list(APPEND configure_args "-DRESILIENCE_REQUEST=${CONSUMER_REQUEST}")
endif()
if(CONSUMER_EXPECT_ASIO)
    list(APPEND configure_args -DRESILIENCE_EXPECT_ASIO=ON)
endif()
run_step("configure" "${CMAKE_COMMAND}" ${configure_args})

# The package must come from the scratch prefix, not from a system-wide install.
file(STRINGS "${CONSUMER_BINARY_DIR}/CMakeCache.txt" found_dir REGEX "^resilience_DIR:")
string(REGEX REPLACE "^[^=]*=" "" found_dir "${found_dir}")
file(REAL_PATH "${CONSUMER_PREFIX}" real_prefix)
file(REAL_PATH "${found_dir}" real_found_dir)
string(FIND "${real_found_dir}" "${real_prefix}/" at)
if(NOT at EQUAL 0)
    message(FATAL_ERROR "cmake_consumer: resilience was found in '${found_dir}', not under '${CONSUMER_PREFIX}'")
endif()

run_step("build" "${CMAKE_COMMAND}" --build "${CONSUMER_BINARY_DIR}" ${config_args})

find_program(consumer_exe consumer
    PATHS "${CONSUMER_BINARY_DIR}" "${CONSUMER_BINARY_DIR}/${CONSUMER_CONFIG}"
    NO_DEFAULT_PATH REQUIRED)
run_step("run ${consumer_exe}" "${consumer_exe}")
if(CONSUMER_EXPECT_ASIO)
    find_program(consumer_asio_exe consumer_asio
        PATHS "${CONSUMER_BINARY_DIR}" "${CONSUMER_BINARY_DIR}/${CONSUMER_CONFIG}"
        NO_DEFAULT_PATH REQUIRED)
    run_step("run ${consumer_asio_exe}" "${consumer_asio_exe}")
endif()
message(STATUS "cmake_consumer: OK")
