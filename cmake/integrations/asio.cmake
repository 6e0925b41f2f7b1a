# resilience::asio: <resilience/asio.hpp> on standalone Asio (header-only; Debian's libasio-dev ships no
# CMake package, vcpkg's asio port does), with ASIO_STANDALONE defined.
# resilience::boost_asio: <resilience/boost_asio.hpp> on Boost.Asio (Boost's headers, 1.81 or later).
# resilience::beast: <resilience/beast.hpp>, Beast's responses for the HTTP classifier (Boost's headers).
include("${CMAKE_CURRENT_LIST_DIR}/common.cmake")

# In a function, so that the lookups' variables stay here and do not reach the includer's scope.
function(resilience_integration_asio)
    find_package(Threads QUIET)

    if(NOT TARGET resilience::asio)
        find_package(asio CONFIG QUIET)
        if(TARGET asio::asio)
            resilience_add_integration(asio LINK asio::asio Threads::Threads DEFINITIONS ASIO_STANDALONE)
        else()
            find_path(RESILIENCE_ASIO_INCLUDE_DIR asio.hpp)
            if(RESILIENCE_ASIO_INCLUDE_DIR)
                resilience_add_integration(asio INCLUDE_DIRS "${RESILIENCE_ASIO_INCLUDE_DIR}" DEFINITIONS ASIO_STANDALONE
                    LINK Threads::Threads)
            endif()
        endif()
    endif()

    if(NOT TARGET resilience::boost_asio)
        # Boost_FOUND, not the target: a Boost found earlier by the includer (an older one) defines
        # Boost::headers too, and this request's failure leaves its variables false here only.
        find_package(Boost 1.81 CONFIG QUIET)
        if(Boost_FOUND AND Boost_VERSION VERSION_GREATER_EQUAL 1.81 AND TARGET Boost::headers)
            resilience_add_integration(boost_asio LINK Boost::headers Threads::Threads)
            resilience_add_integration(beast LINK Boost::headers Threads::Threads)
        endif()
    endif()

    if(NOT RESILIENCE_PACKAGE_IMPORTED)
        foreach(flavour IN ITEMS asio boost_asio)
            if(TARGET resilience_${flavour})
                message(STATUS "resilience: resilience::${flavour} available")
            else()
                message(STATUS "resilience: resilience::${flavour} not available (its Asio was not found)")
            endif()
        endforeach()
    endif()
endfunction()
resilience_integration_asio()
