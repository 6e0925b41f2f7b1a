# Header-only: one (release) configuration is enough.
set(VCPKG_BUILD_TYPE release)

# TODO(release): point URL at the published repository and REF at the tagged v0.1.0 commit.
vcpkg_from_git(
    OUT_SOURCE_PATH SOURCE_PATH
    URL https://github.com/REPLACE-ME/resilience.git
    REF 0000000000000000000000000000000000000000
    HEAD_REF main
)

vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        -DRESILIENCE_BUILD_TESTS=OFF
        -DRESILIENCE_BUILD_EXAMPLES=OFF
        -DRESILIENCE_BUILD_BENCH=OFF
        -DRESILIENCE_USE_CCACHE=OFF
        -DRESILIENCE_INSTALL=ON
)

vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME resilience CONFIG_PATH share/resilience/cmake)

file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/share/doc")

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
