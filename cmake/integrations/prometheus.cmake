# resilience::prometheus: <resilience/prometheus.hpp>, Prometheus series from the library's telemetry, on
# prometheus-cpp (Debian: apt-get install prometheus-cpp-dev). It links prometheus-cpp's core (the
# registry and the metric types) and pull (the Exposer, an HTTP endpoint for Prometheus to scrape).
# Option RESILIENCE_PROMETHEUS. Left out when prometheus-cpp is not found. See common.cmake for where this
# file runs. No include_guard: in the installed package each find_package(resilience) makes its own (directory-scoped)
# imported targets, and resilience_add_integration() does nothing when the target is there already.
include("${CMAKE_CURRENT_LIST_DIR}/common.cmake")

# In a function, so that the lookups' variables stay here and do not reach the includer's scope.
function(resilience_integration_prometheus)
    set(wanted ON)
    if(NOT RESILIENCE_PACKAGE_IMPORTED)
        resilience_integration_wanted(RESILIENCE_PROMETHEUS wanted)
    endif()
    if(wanted AND NOT TARGET prometheus-cpp::core)
        # prometheus-cpp's package finds its own dependencies (civetweb, zlib, curl) with find_dependency,
        # which would fail the caller's configure when one is missing: QUIET keeps that a quiet "not found".
        find_package(prometheus-cpp CONFIG QUIET)
    endif()

    set(found OFF)
    if(wanted AND TARGET prometheus-cpp::core AND TARGET prometheus-cpp::pull)
        set(found ON)
    endif()

    set(make ON)
    if(NOT RESILIENCE_PACKAGE_IMPORTED)
        resilience_integration_option(RESILIENCE_PROMETHEUS ${found} make TARGETS prometheus
            DOC "Provide resilience::prometheus and build its tests, example and benchmark (needs prometheus-cpp)"
            NEEDS "prometheus-cpp with its pull library (Debian: apt-get install prometheus-cpp-dev)")
    endif()
    if(found AND make)
        resilience_add_integration(prometheus LINK prometheus-cpp::core prometheus-cpp::pull)
    endif()
endfunction()
resilience_integration_prometheus()
