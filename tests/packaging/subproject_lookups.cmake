# cmake -P script behind the `subproject_lookups` test: a project that adds resilience with FetchContent
# and links only resilience::resilience must not pay for the integrations it did not ask for.
#   - default: resilience's configure looks up nothing but Threads (a CMake trace of its files shows no
#     other find_package, find_path, find_library or find_program), makes no integration's target and
#     prints nothing about them, and the same on a second configure;
#   - asked for one (-DRESILIENCE_REDIS=ON, or the parent's set(RESILIENCE_PROMETHEUS ON)): it makes that
#     integration's target, looks up only what that needs, and makes no other integration's target;
#   - asked for one that is missing (-DRESILIENCE_PROMETHEUS=ON, prometheus-cpp hidden): the configure
#     fails and names the option;
#   - as the top-level project, a missing integration nobody asked for is skipped and the configure goes on
#     (what `scripts/dev` relies on, on a machine without some of the packages).
#
# Inputs (-D): RESILIENCE_SOURCE_DIR, PARENT_SOURCE_DIR, WORK_DIR; optional: GENERATOR, MAKE_PROGRAM,
#              CXX_COMPILER, and HAVE_REDIS, HAVE_PROMETHEUS (whether this machine has those integrations'
#              dependencies: the cases that ask for one run only then).
cmake_minimum_required(VERSION 3.21)

foreach(var RESILIENCE_SOURCE_DIR PARENT_SOURCE_DIR WORK_DIR)
    if(NOT ${var})
        message(FATAL_ERROR "subproject_lookups.cmake: -D${var}=... is required")
    endif()
endforeach()

set(toolchain_args)
if(GENERATOR)
    list(APPEND toolchain_args -G "${GENERATOR}")
endif()
if(MAKE_PROGRAM)
    list(APPEND toolchain_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_COMPILER)
    list(APPEND toolchain_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
file(REAL_PATH "${RESILIENCE_SOURCE_DIR}" resilience_dir)
file(REAL_PATH "${PARENT_SOURCE_DIR}" parent_dir)

function(fail)
    string(JOIN "" text ${ARGN})
    message(FATAL_ERROR "subproject_lookups: ${text}")
endfunction()

# configure(<name> <result-var> <output-var> <cmake args>...): configure into WORK_DIR/<name>, traced into
# WORK_DIR/<name>.trace.
function(configure name result_var output_var)
    execute_process(
        COMMAND "${CMAKE_COMMAND}" -B "${WORK_DIR}/${name}" ${toolchain_args} -DFETCHCONTENT_FULLY_DISCONNECTED=ON
            --trace-expand "--trace-redirect=${WORK_DIR}/${name}.trace" ${ARGN}
        RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
    set(${result_var} "${result}" PARENT_SCOPE)
    set(${output_var} "${output}" PARENT_SCOPE)
endfunction()

# configure_parent(<name> <expected integration targets, or "none"> <cmake args>...): configure the parent,
# which fails unless resilience made exactly those targets; the output goes to <name>_output.
function(configure_parent name expected)
    configure(${name} result output -S "${PARENT_SOURCE_DIR}" "-DRESILIENCE_SOURCE_DIR=${RESILIENCE_SOURCE_DIR}"
        "-DPARENT_EXPECT_TARGETS=${expected}" ${ARGN})
    if(NOT result EQUAL 0)
        message("${output}")
        fail("${name}: the configure failed (${result})")
    endif()
    set(${name}_output "${output}" PARENT_SCOPE)
endfunction()

# check_quiet(<name> <output>): the configure said nothing about the integrations.
function(check_quiet name output)
    if(output MATCHES "resilience: [^\n]*resilience::(asio|boost_asio|beast|redis|prometheus|grpc)[^\n]*")
        fail("${name}: a subproject that asked for no integration is told about one: ${CMAKE_MATCH_0}")
    endif()
endfunction()

# check_lookups(<name> <allowed>...): every lookup that resilience's own files made in configure <name> is
# one of <allowed>, regular expressions matched against "command(arguments)" as the trace prints it.
function(check_lookups name)
    file(STRINGS "${WORK_DIR}/${name}.trace" calls REGEX "\\):  *find_(package|path|library|program|file)\\(")
    set(unexpected)
    foreach(call IN LISTS calls)
        if(NOT call MATCHES "^(.*)\\(([0-9]+)\\):  *(find_[a-z]+\\(.*)$")
            continue()
        endif()
        set(file "${CMAKE_MATCH_1}")
        set(what "${CMAKE_MATCH_3}")
        string(FIND "${file}" "${resilience_dir}/" in_resilience)
        string(FIND "${file}" "${parent_dir}/" in_parent)
        if(NOT in_resilience EQUAL 0 OR in_parent EQUAL 0)
            continue() # CMake's own modules and the packages they find, or the parent's own lookups
        endif()
        set(allowed FALSE)
        foreach(pattern IN LISTS ARGN)
            if(what MATCHES "^${pattern}")
                set(allowed TRUE)
            endif()
        endforeach()
        if(NOT allowed)
            string(APPEND unexpected "\n  ${call}")
        endif()
    endforeach()
    if(unexpected)
        fail("${name}: resilience looked up what was not asked for:${unexpected}")
    endif()
endfunction()

set(threads "find_package\\(Threads ")

configure_parent(default none)
check_lookups(default "${threads}")
check_quiet(default "${default_output}")
# Again, with the options now in the cache.
configure_parent(default none)
check_lookups(default "${threads}")
check_quiet(default "${default_output}")
message(STATUS "subproject_lookups: by default a subproject looks up only Threads and makes no integration")

if(HAVE_REDIS)
    configure_parent(redis redis -DRESILIENCE_REDIS=ON)
    check_lookups(redis "${threads}" "find_path\\(RESILIENCE_ASIO_INCLUDE_DIR " "find_path\\(RESILIENCE_HIREDIS_INCLUDE_DIR "
        "find_library\\(RESILIENCE_HIREDIS_LIBRARY ")
    message(STATUS "subproject_lookups: -DRESILIENCE_REDIS=ON makes resilience::redis and looks up only its dependencies")
else()
    message(STATUS "subproject_lookups: no Asio and hiredis here, -DRESILIENCE_REDIS=ON not tried")
endif()

if(HAVE_PROMETHEUS)
    configure_parent(asked-by-set prometheus -DPARENT_ASKS=RESILIENCE_PROMETHEUS)
    check_lookups(asked-by-set "${threads}" "find_package\\(prometheus-cpp ")
    message(STATUS "subproject_lookups: set(RESILIENCE_PROMETHEUS ON) in the parent makes resilience::prometheus alone")
else()
    message(STATUS "subproject_lookups: no prometheus-cpp here, set(RESILIENCE_PROMETHEUS ON) not tried")
endif()

configure(missing result output -S "${PARENT_SOURCE_DIR}" "-DRESILIENCE_SOURCE_DIR=${RESILIENCE_SOURCE_DIR}"
    -DRESILIENCE_PROMETHEUS=ON -DCMAKE_DISABLE_FIND_PACKAGE_prometheus-cpp=ON)
if(result EQUAL 0)
    fail("missing: -DRESILIENCE_PROMETHEUS=ON without prometheus-cpp configured")
endif()
if(NOT output MATCHES "RESILIENCE_PROMETHEUS needs prometheus-cpp")
    message("${output}")
    fail("missing: the error does not name RESILIENCE_PROMETHEUS and what it needs")
endif()
message(STATUS "subproject_lookups: an integration asked for and missing fails the configure, naming the option")

configure(top-level result output -S "${RESILIENCE_SOURCE_DIR}" -DRESILIENCE_BUILD_TESTS=OFF
    -DRESILIENCE_BUILD_EXAMPLES=OFF -DRESILIENCE_BUILD_BENCH=OFF -DRESILIENCE_USE_CCACHE=OFF
    -DCMAKE_DISABLE_FIND_PACKAGE_prometheus-cpp=ON)
if(NOT result EQUAL 0)
    message("${output}")
    fail("top-level: the configure failed without prometheus-cpp, which nobody asked for (${result})")
endif()
if(NOT output MATCHES "resilience::prometheus not available")
    message("${output}")
    fail("top-level: the configure does not say that resilience::prometheus was left out")
endif()
message(STATUS "subproject_lookups: as the top-level project, a missing integration is skipped")
message(STATUS "subproject_lookups: OK")
