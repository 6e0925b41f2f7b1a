# resilience::asio: <resilience/asio.hpp> on standalone Asio (header-only; Debian's libasio-dev ships no
# CMake package, vcpkg's asio port does), with ASIO_STANDALONE defined. Option RESILIENCE_ASIO.
# resilience::boost_asio: <resilience/boost_asio.hpp> on Boost.Asio (Boost's headers, 1.81 or later).
# resilience::beast: <resilience/beast.hpp>, Beast's responses for the HTTP classifier (Boost's headers).
# Option RESILIENCE_BOOST_ASIO, for both.
include("${CMAKE_CURRENT_LIST_DIR}/common.cmake")

# In a function, so that the lookups' variables stay here and do not reach the includer's scope.
function(resilience_integration_asio)
    set(want_asio ON)
    set(want_boost ON)
    if(NOT RESILIENCE_PACKAGE_IMPORTED)
        resilience_integration_wanted(RESILIENCE_ASIO want_asio)
        resilience_integration_wanted(RESILIENCE_BOOST_ASIO want_boost)
    endif()
    if(want_asio OR want_boost)
        find_package(Threads QUIET)
    endif()

    set(asio_link)
    if(want_asio AND NOT TARGET resilience::asio)
        find_package(asio CONFIG QUIET)
        if(TARGET asio::asio)
            set(asio_link LINK asio::asio Threads::Threads DEFINITIONS ASIO_STANDALONE)
        else()
            find_path(RESILIENCE_ASIO_INCLUDE_DIR asio.hpp)
            if(RESILIENCE_ASIO_INCLUDE_DIR)
                set(asio_link INCLUDE_DIRS "${RESILIENCE_ASIO_INCLUDE_DIR}" DEFINITIONS ASIO_STANDALONE
                    LINK Threads::Threads)
            endif()
        endif()
    endif()

    set(boost_found OFF)
    if(want_boost AND NOT TARGET resilience::boost_asio)
        # Boost_FOUND, not the target: a Boost found earlier by the includer (an older one) defines
        # Boost::headers too, and this request's failure leaves its variables false here only.
        find_package(Boost 1.81 CONFIG QUIET)
        if(Boost_FOUND AND Boost_VERSION VERSION_GREATER_EQUAL 1.81 AND TARGET Boost::headers)
            set(boost_found ON)
        endif()
    endif()

    set(make_asio ON)
    set(make_boost ON)
    if(NOT RESILIENCE_PACKAGE_IMPORTED)
        set(asio_found OFF)
        if(asio_link)
            set(asio_found ON)
        endif()
        resilience_integration_option(RESILIENCE_ASIO ${asio_found} make_asio TARGETS asio
            DOC "Provide resilience::asio and build its tests (needs standalone Asio)"
            NEEDS "standalone Asio 1.22 or later (Debian: apt-get install libasio-dev)")
        resilience_integration_option(RESILIENCE_BOOST_ASIO ${boost_found} make_boost TARGETS boost_asio beast
            DOC "Provide resilience::boost_asio and resilience::beast and build their tests (needs Boost 1.81 or later)"
            NEEDS "Boost 1.81 or later (Debian: apt-get install libboost1.81-dev)")
    endif()
    if(asio_link AND make_asio)
        resilience_add_integration(asio ${asio_link})
    endif()
    if(boost_found AND make_boost)
        resilience_add_integration(boost_asio LINK Boost::headers Threads::Threads)
        resilience_add_integration(beast LINK Boost::headers Threads::Threads)
    endif()
endfunction()
resilience_integration_asio()
