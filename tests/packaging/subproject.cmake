# cmake -P script behind the `subproject_install` test: resilience as a FetchContent subproject installs
# nothing by default (RESILIENCE_INSTALL follows PROJECT_IS_TOP_LEVEL), and installs its headers and CMake
# package when the parent sets RESILIENCE_INSTALL ON, so the parent can export a target that links it.
#
# Inputs (-D): RESILIENCE_SOURCE_DIR, PARENT_SOURCE_DIR, WORK_DIR; optional: GENERATOR, MAKE_PROGRAM,
#              CXX_COMPILER.
cmake_minimum_required(VERSION 3.21)

foreach(var RESILIENCE_SOURCE_DIR PARENT_SOURCE_DIR WORK_DIR)
    if(NOT ${var})
        message(FATAL_ERROR "subproject.cmake: -D${var}=... is required")
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

# configure_and_install(<name> <extra cmake args>...): configure the parent into WORK_DIR/<name>-build and
# install it into WORK_DIR/<name>-prefix.
function(configure_and_install name)
    set(build "${WORK_DIR}/${name}-build")
    foreach(step configure install)
        if(step STREQUAL "configure")
            set(command "${CMAKE_COMMAND}" -S "${PARENT_SOURCE_DIR}" -B "${build}" ${toolchain_args}
                "-DRESILIENCE_SOURCE_DIR=${RESILIENCE_SOURCE_DIR}" -DFETCHCONTENT_FULLY_DISCONNECTED=ON ${ARGN})
        else()
            set(command "${CMAKE_COMMAND}" --install "${build}" --prefix "${WORK_DIR}/${name}-prefix")
        endif()
        execute_process(COMMAND ${command} RESULT_VARIABLE result OUTPUT_VARIABLE log ERROR_VARIABLE log)
        if(NOT result EQUAL 0)
            message("${log}")
            message(FATAL_ERROR "subproject_install: ${name}: ${step} failed (${result})")
        endif()
    endforeach()
endfunction()

configure_and_install(default)
foreach(path include/resilience share/resilience)
    if(EXISTS "${WORK_DIR}/default-prefix/${path}")
        message(FATAL_ERROR "subproject_install: a subproject installed ${path} without RESILIENCE_INSTALL")
    endif()
endforeach()
message(STATUS "subproject_install: by default a subproject installs nothing")

configure_and_install(opted-in -DPARENT_INSTALLS=ON)
foreach(path
        include/resilience/resilience.hpp
        include/resilience/asio/clock.hpp
        include/resilience/redis/resp.hpp
        share/resilience/cmake/resilienceConfig.cmake
        share/resilience/cmake/resilienceConfigVersion.cmake
        share/resilience/cmake/resilienceTargets.cmake
        share/parent/parentTargets.cmake)
    if(NOT EXISTS "${WORK_DIR}/opted-in-prefix/${path}")
        message(FATAL_ERROR "subproject_install: with RESILIENCE_INSTALL ON, ${path} was not installed")
    endif()
endforeach()
message(STATUS "subproject_install: with RESILIENCE_INSTALL ON the parent exports its target and resilience installs")
message(STATUS "subproject_install: OK")
