# cmake -P script behind the `vcpkg_overlay_port` test: runs vcpkg/ports/resilience/portfile.cmake the way
# vcpkg would, without vcpkg. The vcpkg helpers the portfile calls are small stand-ins defined below
# (configure, build the install target, check the fixup layout, install the copyright); then the script
# checks what vcpkg's post-build checks and a user would see:
#   - the package layout in the packages directory: share/resilience/{resilienceConfig,
#     resilienceConfigVersion,resilienceTargets}.cmake, usage and copyright; every public header; no
#     debug/, lib/, bin/ or share/doc; no absolute path of the build machine in an installed file;
#   - the port's version (vcpkg.json) is the project's version;
#   - the package still works once moved to another prefix (vcpkg installs from packages/ to installed/):
#     tests/cmake_consumer configures against it with find_package(resilience <major.minor> CONFIG);
#   - the 0.x version rule: only the same 0.minor is compatible, through find_package and through the
#     installed resilienceConfigVersion.cmake.
# The stand-ins cover what this portfile uses, nothing more; the real vcpkg is run by CI's vcpkg job.
#
# Inputs (-D): PORT_DIR, WORK_DIR, CONSUMER_SOURCE_DIR, PROJECT_VERSION (the version project() declares);
#              optional: GENERATOR, MAKE_PROGRAM, CXX_COMPILER.
cmake_minimum_required(VERSION 3.21)

foreach(var PORT_DIR WORK_DIR CONSUMER_SOURCE_DIR PROJECT_VERSION)
    if(NOT ${var})
        message(FATAL_ERROR "vcpkg_port.cmake: -D${var}=... is required")
    endif()
endforeach()

function(fail)
    string(JOIN "" text ${ARGN})
    message(FATAL_ERROR "vcpkg_overlay_port: ${text}")
endfunction()

function(run_step what)
    message(STATUS "vcpkg_overlay_port: ${what}")
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT result EQUAL 0)
        message("${out}")
        fail("${what} failed (${result})")
    endif()
endfunction()

# Compiler and generator of the enclosing build, so nothing else has to be detected.
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

# ---------------------------------------------------------------------------------------------------------
# What vcpkg sets before it includes a portfile.

file(REMOVE_RECURSE "${WORK_DIR}")
set(PORT resilience)
set(TARGET_TRIPLET emulated)
set(CURRENT_PORT_DIR "${PORT_DIR}")
set(CURRENT_BUILDTREES_DIR "${WORK_DIR}/buildtrees/${PORT}")
set(CURRENT_PACKAGES_DIR "${WORK_DIR}/packages/${PORT}_${TARGET_TRIPLET}")
set(installed_dir "${WORK_DIR}/installed/${TARGET_TRIPLET}")
file(MAKE_DIRECTORY "${CURRENT_BUILDTREES_DIR}" "${CURRENT_PACKAGES_DIR}")

file(READ "${PORT_DIR}/vcpkg.json" manifest)
string(JSON port_name GET "${manifest}" name)
string(JSON VERSION GET "${manifest}" version)
if(NOT port_name STREQUAL PORT)
    fail("vcpkg.json names the port '${port_name}', not '${PORT}'")
endif()
if(NOT VERSION STREQUAL PROJECT_VERSION)
    fail("vcpkg.json has version ${VERSION}, project() declares ${PROJECT_VERSION}")
endif()

# ---------------------------------------------------------------------------------------------------------
# Stand-ins for the vcpkg helpers the portfile calls.

macro(refuse_download name)
    function(${name})
        fail("the overlay port called ${CMAKE_CURRENT_FUNCTION}: it must build the checkout, not fetch")
    endfunction()
endmacro()
refuse_download(vcpkg_from_github)
refuse_download(vcpkg_from_git)
refuse_download(vcpkg_download_distfile)

function(vcpkg_cmake_configure)
    cmake_parse_arguments(PARSE_ARGV 0 arg "" "SOURCE_PATH" "OPTIONS;OPTIONS_RELEASE;OPTIONS_DEBUG")
    if(NOT VCPKG_BUILD_TYPE STREQUAL "release")
        fail("a header-only port builds one configuration: set(VCPKG_BUILD_TYPE release)")
    endif()
    if(NOT EXISTS "${arg_SOURCE_PATH}/CMakeLists.txt")
        fail("SOURCE_PATH '${arg_SOURCE_PATH}' has no CMakeLists.txt")
    endif()
    # The options vcpkg's own vcpkg_cmake_configure adds that bear on an install layout.
    run_step("configure ${arg_SOURCE_PATH}"
        "${CMAKE_COMMAND}" -S "${arg_SOURCE_PATH}" -B "${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-rel"
        ${toolchain_args}
        -DCMAKE_BUILD_TYPE=Release
        "-DCMAKE_INSTALL_PREFIX=${CURRENT_PACKAGES_DIR}"
        -DCMAKE_INSTALL_BINDIR=bin -DCMAKE_INSTALL_LIBDIR=lib
        -DCMAKE_EXPORT_NO_PACKAGE_REGISTRY=ON -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
        -DFETCHCONTENT_FULLY_DISCONNECTED=ON
        ${arg_OPTIONS} ${arg_OPTIONS_RELEASE})
    set_property(GLOBAL PROPERTY vcpkg_stub_configured TRUE)
endfunction()

function(vcpkg_cmake_install)
    get_property(configured GLOBAL PROPERTY vcpkg_stub_configured)
    if(NOT configured)
        fail("vcpkg_cmake_install() before vcpkg_cmake_configure()")
    endif()
    run_step("build the install target"
        "${CMAKE_COMMAND}" --build "${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-rel" --target install)
endfunction()

# vcpkg's fixup moves CONFIG_PATH to share/<PACKAGE_NAME> and rewrites the relative paths in it. The port
# installs straight into share/resilience, so here there is nothing to move: the stand-in checks that.
function(vcpkg_cmake_config_fixup)
    cmake_parse_arguments(PARSE_ARGV 0 arg "" "PACKAGE_NAME;CONFIG_PATH" "")
    if(NOT arg_PACKAGE_NAME)
        set(arg_PACKAGE_NAME "${PORT}")
    endif()
    if(NOT arg_CONFIG_PATH)
        set(arg_CONFIG_PATH "share/${arg_PACKAGE_NAME}")
    endif()
    if(NOT arg_CONFIG_PATH STREQUAL "share/${arg_PACKAGE_NAME}")
        fail("CONFIG_PATH ${arg_CONFIG_PATH}: this stand-in only checks a package already in share/${arg_PACKAGE_NAME}")
    endif()
    if(NOT EXISTS "${CURRENT_PACKAGES_DIR}/${arg_CONFIG_PATH}/${arg_PACKAGE_NAME}Config.cmake")
        fail("no ${arg_CONFIG_PATH}/${arg_PACKAGE_NAME}Config.cmake in ${CURRENT_PACKAGES_DIR}")
    endif()
endfunction()

function(vcpkg_install_copyright)
    cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "FILE_LIST")
    set(text "")
    foreach(file IN LISTS arg_FILE_LIST)
        if(NOT EXISTS "${file}")
            fail("vcpkg_install_copyright: ${file} does not exist")
        endif()
        file(READ "${file}" part)
        string(APPEND text "${part}")
    endforeach()
    file(WRITE "${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright" "${text}")
endfunction()

# ---------------------------------------------------------------------------------------------------------
# Run the portfile.

include("${PORT_DIR}/portfile.cmake")

# ---------------------------------------------------------------------------------------------------------
# The layout in the packages directory.

set(pkg "${CURRENT_PACKAGES_DIR}")
foreach(file
        share/resilience/resilienceConfig.cmake
        share/resilience/resilienceConfigVersion.cmake
        share/resilience/resilienceTargets.cmake
        share/resilience/usage
        share/resilience/copyright
        share/resilience/integrations/common.cmake
        share/resilience/integrations/asio.cmake
        share/resilience/integrations/redis.cmake
        include/resilience/resilience.hpp
        include/resilience/asio/clock.hpp
        include/resilience/asio_flavour/clock.hpp
        include/resilience/boost_asio.hpp
        include/resilience/redis/resp.hpp)
    if(NOT EXISTS "${pkg}/${file}")
        fail("${file} is missing from the package")
    endif()
endforeach()
foreach(dir debug lib bin share/doc share/resilience/cmake)
    if(EXISTS "${pkg}/${dir}")
        fail("the package has ${dir}/: a header-only release-only port with its config in share/resilience has none")
    endif()
endforeach()

file(READ "${SOURCE_PATH}/LICENSE" license)
file(READ "${pkg}/share/resilience/copyright" copyright)
if(NOT copyright STREQUAL license)
    fail("share/resilience/copyright is not the LICENSE file")
endif()

file(GLOB_RECURSE source_headers RELATIVE "${SOURCE_PATH}/include" "${SOURCE_PATH}/include/*.hpp"
    "${SOURCE_PATH}/include/*.ipp")
file(GLOB_RECURSE package_headers RELATIVE "${pkg}/include" "${pkg}/include/*")
list(SORT source_headers)
list(SORT package_headers)
if(NOT source_headers STREQUAL package_headers)
    fail("the package's headers differ from include/:\n  source:  ${source_headers}\n  package: ${package_headers}")
endif()

# vcpkg moves the package after the build: no installed file may name a directory of this build.
file(GLOB_RECURSE package_files "${pkg}/share/*")
foreach(file IN LISTS package_files)
    file(READ "${file}" text)
    foreach(dir "${pkg}" "${WORK_DIR}" "${SOURCE_PATH}")
        string(FIND "${text}" "${dir}" at)
        if(NOT at EQUAL -1)
            fail("${file} names the build machine's directory ${dir}")
        endif()
    endforeach()
endforeach()

# ---------------------------------------------------------------------------------------------------------
# The 0.x version rule, on the installed version file. check_request(<installed> <requested> <TRUE|FALSE>)
# evaluates resilienceConfigVersion.cmake as find_package() would, with the package's version replaced by
# <installed> (the file embeds it as a literal) to see how a later release of the same file answers.

file(READ "${pkg}/share/resilience/resilienceConfigVersion.cmake" version_file)
set(PACKAGE_VERSION "")
include("${pkg}/share/resilience/resilienceConfigVersion.cmake")
if(NOT PACKAGE_VERSION STREQUAL PROJECT_VERSION)
    fail("resilienceConfigVersion.cmake says ${PACKAGE_VERSION}, project() declares ${PROJECT_VERSION}")
endif()
set(package_version "${PACKAGE_VERSION}")

function(check_request installed requested expected)
    string(REPLACE "\"${package_version}\"" "\"${installed}\"" text "${version_file}")
    set(file "${WORK_DIR}/version-check/${installed}.cmake")
    file(WRITE "${file}" "${text}")
    string(REPLACE "." ";" parts "${requested}")
    list(LENGTH parts PACKAGE_FIND_VERSION_COUNT)
    list(APPEND parts 0 0 0)
    list(GET parts 0 PACKAGE_FIND_VERSION_MAJOR)
    list(GET parts 1 PACKAGE_FIND_VERSION_MINOR)
    list(GET parts 2 PACKAGE_FIND_VERSION_PATCH)
    list(GET parts 3 PACKAGE_FIND_VERSION_TWEAK)
    set(PACKAGE_FIND_VERSION "${requested}")
    set(PACKAGE_FIND_VERSION_RANGE "")
    set(PACKAGE_VERSION_COMPATIBLE "")
    include("${file}")
    if(NOT PACKAGE_VERSION STREQUAL installed)
        fail("the version file patched to ${installed} reports ${PACKAGE_VERSION}")
    endif()
    if(NOT PACKAGE_VERSION_COMPATIBLE STREQUAL expected)
        fail("installed ${installed}, requested ${requested}: compatible is '${PACKAGE_VERSION_COMPATIBLE}', expected ${expected}")
    endif()
endfunction()

string(REGEX MATCH "^([0-9]+)\\.([0-9]+)\\.([0-9]+)$" _ "${package_version}")
set(major ${CMAKE_MATCH_1})
set(minor ${CMAKE_MATCH_2})
set(patch ${CMAKE_MATCH_3})
if(major EQUAL 0)
    check_request(0.1.0 0.1 TRUE)
    check_request(0.1.0 0.1.0 TRUE)
    check_request(0.1.7 0.1 TRUE)        # a later patch answers
    check_request(0.1.7 0.1.2 TRUE)
    check_request(0.1.2 0.1.7 FALSE)     # an older patch does not
    check_request(0.9.0 0.1 FALSE)       # a later 0.minor may break the API: refused
    check_request(0.2.0 0.1.9 FALSE)
    check_request(0.1.0 0.2 FALSE)
    check_request(1.0.0 0.1 FALSE)
    check_request(0.1.0 1.0 FALSE)
else()
    # From 1.0 on the major version decides.
    math(EXPR next_major "${major} + 1")
    check_request(${major}.9.0 ${major}.1 TRUE)
    check_request(${next_major}.0.0 ${major}.1 FALSE)
endif()
message(STATUS "vcpkg_overlay_port: version rule OK for ${package_version}")

# ---------------------------------------------------------------------------------------------------------
# A consumer of the package once moved to its installed prefix, through find_package().

file(COPY "${pkg}/" DESTINATION "${installed_dir}")
file(REMOVE_RECURSE "${pkg}")

function(configure_consumer request out_result out_log)
    set(binary_dir "${WORK_DIR}/consumer-${request}")
    execute_process(
        COMMAND "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${binary_dir}" ${toolchain_args}
            "-DCMAKE_PREFIX_PATH=${installed_dir}"
            -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF
            "-DRESILIENCE_REQUEST=${request}"
        RESULT_VARIABLE result OUTPUT_VARIABLE log ERROR_VARIABLE log)
    set(${out_result} "${result}" PARENT_SCOPE)
    set(${out_log} "${log}" PARENT_SCOPE)
endfunction()

set(same_minor "${major}.${minor}")
configure_consumer("${same_minor}" result log)
if(NOT result EQUAL 0)
    message("${log}")
    fail("the consumer asking for ${same_minor} did not configure against ${installed_dir}")
endif()
file(STRINGS "${WORK_DIR}/consumer-${same_minor}/CMakeCache.txt" found_dir REGEX "^resilience_DIR:")
string(REGEX REPLACE "^[^=]*=" "" found_dir "${found_dir}")
if(NOT found_dir STREQUAL "${installed_dir}/share/resilience")
    fail("the consumer found resilience in '${found_dir}', not in ${installed_dir}/share/resilience")
endif()
message(STATUS "vcpkg_overlay_port: find_package(resilience ${same_minor}) found ${found_dir}")

if(major EQUAL 0)
    math(EXPR next_minor "${minor} + 1")
    set(refused "0.${next_minor}")
else()
    math(EXPR next_major "${major} + 1")
    set(refused "${next_major}.0")
endif()
configure_consumer("${refused}" result log)
if(result EQUAL 0)
    fail("find_package(resilience ${refused}) accepted the installed ${package_version}")
endif()
if(NOT log MATCHES "compatible with requested version")
    message("${log}")
    fail("the consumer asking for ${refused} failed, but not for the version")
endif()
message(STATUS "vcpkg_overlay_port: find_package(resilience ${refused}) refused ${package_version}, as it should")

message(STATUS "vcpkg_overlay_port: OK")
