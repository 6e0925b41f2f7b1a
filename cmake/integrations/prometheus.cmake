# resilience::prometheus: <resilience/prometheus.hpp>, Prometheus series from the library's telemetry, on
# prometheus-cpp (Debian: apt-get install prometheus-cpp-dev). It links prometheus-cpp's core (the
# registry and the metric types) and pull (the Exposer, an HTTP endpoint for Prometheus to scrape).
# Left out, quietly, when prometheus-cpp is not found. See common.cmake for where this file runs. No
# include_guard: in the installed package each find_package(resilience) makes its own (directory-scoped)
# imported targets, and resilience_add_integration() does nothing when the target is there already.
include("${CMAKE_CURRENT_LIST_DIR}/common.cmake")

# In a function, so that the lookups' variables stay here and do not reach the includer's scope.
function(resilience_integration_prometheus)

    if(NOT TARGET prometheus-cpp::core)
        # prometheus-cpp's package finds its own dependencies (civetweb, zlib, curl) with find_dependency,
        # which would fail the caller's configure when one is missing: QUIET keeps that a quiet "not found".
        find_package(prometheus-cpp CONFIG QUIET)
    endif()

    set(resilience_prometheus_found OFF)
    if(TARGET prometheus-cpp::core AND TARGET prometheus-cpp::pull)
        set(resilience_prometheus_found ON)
    endif()

    if(RESILIENCE_PACKAGE_IMPORTED)
        # The installed package: the target is made whenever prometheus-cpp is there.
        if(resilience_prometheus_found)
            resilience_add_integration(prometheus LINK prometheus-cpp::core prometheus-cpp::pull)
        endif()
    else()
        option(RESILIENCE_PROMETHEUS
            "Provide resilience::prometheus and build its tests, example and benchmark (needs prometheus-cpp)"
            ${resilience_prometheus_found})
        if(RESILIENCE_PROMETHEUS AND NOT resilience_prometheus_found)
            message(FATAL_ERROR "resilience: RESILIENCE_PROMETHEUS needs prometheus-cpp with its pull library "
                                "(Debian: apt-get install prometheus-cpp-dev), or -DRESILIENCE_PROMETHEUS=OFF")
        endif()
        if(RESILIENCE_PROMETHEUS)
            resilience_add_integration(prometheus LINK prometheus-cpp::core prometheus-cpp::pull)
            message(STATUS "resilience: resilience::prometheus enabled")
        else()
            message(STATUS "resilience: resilience::prometheus disabled")
        endif()
    endif()
endfunction()
resilience_integration_prometheus()
