# resilience::grpc: include/resilience/grpc.hpp on gRPC's C++ library (docs/grpc.md). Made when
# find_package(gRPC CONFIG) finds it (Debian: libgrpc++-dev); without it, the target is left out. Option
# RESILIENCE_GRPC.

# Debian's gRPC config stops CMake with an error when the code generators it lists (grpc_cpp_plugin
# and the others of protobuf-compiler-grpc) are not installed, QUIET or not: it is only asked when they
# are there, or when gRPC_DIR names a config explicitly.
include("${CMAKE_CURRENT_LIST_DIR}/common.cmake")

# In a function, so that the lookups' variables stay here and do not reach the includer's scope.
function(resilience_integration_grpc)
    set(wanted ON)
    if(NOT RESILIENCE_PACKAGE_IMPORTED)
        resilience_integration_wanted(RESILIENCE_GRPC wanted)
    endif()
    if(wanted)
        find_program(RESILIENCE_GRPC_CPP_PLUGIN grpc_cpp_plugin)
        mark_as_advanced(RESILIENCE_GRPC_CPP_PLUGIN)
        if(RESILIENCE_GRPC_CPP_PLUGIN OR gRPC_DIR)
            find_package(gRPC CONFIG QUIET)
        endif()
    endif()
    set(found OFF)
    # gRPC's config finds protobuf for itself; its grpc++ target links protobuf::libprotobuf.
    if(wanted AND gRPC_FOUND AND TARGET gRPC::grpc++ AND TARGET protobuf::libprotobuf)
        set(found ON)
    endif()

    set(make ON)
    if(NOT RESILIENCE_PACKAGE_IMPORTED)
        resilience_integration_option(RESILIENCE_GRPC ${found} make TARGETS grpc
            DOC "Provide resilience::grpc and build its tests (needs gRPC's C++ library)"
            NEEDS "gRPC's C++ library and its code generator (Debian: apt-get install libgrpc++-dev protobuf-compiler-grpc)"
            DETAIL "gRPC ${gRPC_VERSION}")
    endif()
    if(found AND make)
        resilience_add_integration(grpc LINK gRPC::grpc++)
    endif()
endfunction()
resilience_integration_grpc()
