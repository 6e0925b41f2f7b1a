# resilience::redis: <resilience/redis.hpp>, the limits shared through Redis (docs/redis.md). It needs
# standalone Asio (header-only, no CMake package on Debian: libasio-dev) and hiredis (libhiredis-dev), of
# which only the RESP reader is used. Option RESILIENCE_REDIS. See common.cmake for where this file runs.
include("${CMAKE_CURRENT_LIST_DIR}/common.cmake")

# In a function, so that the lookups' variables stay here and do not reach the includer's scope.
function(resilience_integration_redis)
    set(wanted ON)
    if(NOT RESILIENCE_PACKAGE_IMPORTED)
        resilience_integration_wanted(RESILIENCE_REDIS wanted)
    elseif(TARGET resilience::redis)
        return()
    endif()
    set(found OFF)
    if(wanted)
        find_package(Threads QUIET)
        find_path(RESILIENCE_ASIO_INCLUDE_DIR asio.hpp)
        find_path(RESILIENCE_HIREDIS_INCLUDE_DIR hiredis/read.h)
        find_library(RESILIENCE_HIREDIS_LIBRARY hiredis)
        if(RESILIENCE_ASIO_INCLUDE_DIR AND RESILIENCE_HIREDIS_INCLUDE_DIR AND RESILIENCE_HIREDIS_LIBRARY)
            set(found ON)
        endif()
    endif()

    set(make ON)
    if(NOT RESILIENCE_PACKAGE_IMPORTED)
        resilience_integration_option(RESILIENCE_REDIS ${found} make TARGETS redis
            DOC "Provide resilience::redis and build its tests, example and benchmark (needs Asio and hiredis)"
            NEEDS "standalone Asio and hiredis (Debian: apt-get install libasio-dev libhiredis-dev)"
            DETAIL "hiredis: ${RESILIENCE_HIREDIS_LIBRARY}")
    endif()
    if(found AND make)
        resilience_add_integration(redis
            INCLUDE_DIRS "${RESILIENCE_ASIO_INCLUDE_DIR}" "${RESILIENCE_HIREDIS_INCLUDE_DIR}"
            DEFINITIONS ASIO_STANDALONE
            LINK "${RESILIENCE_HIREDIS_LIBRARY}" Threads::Threads)
    endif()
endfunction()
resilience_integration_redis()
