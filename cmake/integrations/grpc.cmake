# resilience::grpc: include/resilience/grpc.hpp on gRPC's C++ library (docs/grpc.md). Made when
# find_package(gRPC CONFIG) finds it (Debian: libgrpc++-dev); without it, the target is left out.

# Debian's gRPC config stops CMake with an error when the code generators it lists (grpc_cpp_plugin
# and the others of protobuf-compiler-grpc) are not installed, QUIET or not: it is only asked when they
# are there, or when gRPC_DIR names a config explicitly.
include("${CMAKE_CURRENT_LIST_DIR}/common.cmake")

# In a function, so that the lookups' variables stay here and do not reach the includer's scope.
function(resilience_integration_grpc)
    find_program(RESILIENCE_GRPC_CPP_PLUGIN grpc_cpp_plugin)
    mark_as_advanced(RESILIENCE_GRPC_CPP_PLUGIN)
    if(RESILIENCE_GRPC_CPP_PLUGIN OR gRPC_DIR)
        find_package(gRPC CONFIG QUIET)
    endif()
    set(resilience_grpc_found OFF)
    # gRPC's config finds protobuf for itself; its grpc++ target links protobuf::libprotobuf.
    if(gRPC_FOUND AND TARGET gRPC::grpc++ AND TARGET protobuf::libprotobuf)
        set(resilience_grpc_found ON)
    endif()

    if(NOT RESILIENCE_PACKAGE_IMPORTED)
        option(RESILIENCE_GRPC "Provide resilience::grpc and build its tests (needs gRPC's C++ library)"
            ${resilience_grpc_found})
    endif()

    if(resilience_grpc_found AND (RESILIENCE_PACKAGE_IMPORTED OR RESILIENCE_GRPC))
        resilience_add_integration(grpc LINK gRPC::grpc++)
        if(NOT RESILIENCE_PACKAGE_IMPORTED)
            message(STATUS "resilience: resilience::grpc enabled (gRPC ${gRPC_VERSION})")
        endif()
    elseif(NOT RESILIENCE_PACKAGE_IMPORTED)
        if(RESILIENCE_GRPC)
            message(FATAL_ERROR "resilience: RESILIENCE_GRPC needs gRPC's C++ library and its code generator "
                                "(Debian: apt-get install libgrpc++-dev protobuf-compiler-grpc), "
                                "or -DRESILIENCE_GRPC=OFF")
        else()
            message(STATUS "resilience: resilience::grpc disabled")
        endif()
    endif()
endfunction()
resilience_integration_grpc()
