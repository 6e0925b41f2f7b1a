# Overlay port: builds the resilience checkout that this file lives in (vcpkg/ports/resilience, three
# levels below the repository root), so a user can install the tree they have:
#     vcpkg install resilience --overlay-ports=<checkout>/vcpkg/ports
# vcpkg keys its binary cache on the port's files, not on this source tree: after editing the sources,
# `vcpkg remove resilience` and install again with --no-binarycaching.
#
# A registry port for a release fetches the tagged sources in place of the lines below that set and
# check SOURCE_PATH; that form is in docs/install.md and is filled in at release time.
# tests/packaging/vcpkg_port.cmake runs this file's steps with plain CMake when vcpkg is not installed.

# Header-only: one (release) configuration is enough.
set(VCPKG_BUILD_TYPE release)

get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT EXISTS "${SOURCE_PATH}/include/resilience/resilience.hpp")
    message(FATAL_ERROR "resilience overlay port: no resilience checkout at ${SOURCE_PATH}")
endif()

vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        -DRESILIENCE_BUILD_TESTS=OFF
        -DRESILIENCE_BUILD_EXAMPLES=OFF
        -DRESILIENCE_BUILD_BENCH=OFF
        -DRESILIENCE_USE_CCACHE=OFF
        -DRESILIENCE_INSTALL=ON
        # The package makes the integrations' targets on the consumer's machine (cmake/integrations); the
        # build's own would only cost their lookups.
        -DRESILIENCE_ASIO=OFF
        -DRESILIENCE_BOOST_ASIO=OFF
        -DRESILIENCE_REDIS=OFF
        -DRESILIENCE_PROMETHEUS=OFF
        -DRESILIENCE_GRPC=OFF
        # vcpkg's layout: the package files straight in share/resilience, so the fixup moves nothing.
        -DRESILIENCE_INSTALL_CMAKEDIR=share/resilience
)

vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME resilience CONFIG_PATH share/resilience)

# The license goes to share/resilience/copyright, vcpkg's place for it, not to share/doc.
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/share/doc")

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
