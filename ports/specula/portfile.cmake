# vcpkg overlay port for specula (header-only; see docs/packaging.md).
#
#   vcpkg install specula --overlay-ports=<specula checkout>/ports
#
# Source location
# ---------------
# specula has no public release URL yet, so this port builds a local checkout:
#
#   1. $ENV{SPECULA_SOURCE_PATH}, when set. vcpkg scrubs the environment of
#      port builds, so it must be passed through explicitly:
#        VCPKG_KEEP_ENV_VARS=SPECULA_SOURCE_PATH SPECULA_SOURCE_PATH=/path/to/specula \
#          vcpkg install specula --overlay-ports=/path/to/specula/ports
#   2. otherwise the checkout this overlay port lives in (ports/specula/../..).
#
# Once specula is published, replace this block with
#   vcpkg_from_github(OUT_SOURCE_PATH SOURCE_PATH REPO <owner>/specula
#                     REF "v${VERSION}" SHA512 <sha512> HEAD_REF main)
#
# vcpkg's ABI hash covers this port directory, not the checkout: after changing
# the sources, rebuild with `vcpkg remove specula` (classic mode) or
# `--no-binarycaching`, or bump "port-version" in vcpkg.json.
if(DEFINED ENV{SPECULA_SOURCE_PATH} AND NOT "$ENV{SPECULA_SOURCE_PATH}" STREQUAL "")
  file(TO_CMAKE_PATH "$ENV{SPECULA_SOURCE_PATH}" SOURCE_PATH)
else()
  get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
endif()
if(NOT EXISTS "${SOURCE_PATH}/CMakeLists.txt"
   OR NOT EXISTS "${SOURCE_PATH}/include/specula/version.hpp")
  message(FATAL_ERROR "specula: '${SOURCE_PATH}' is not a specula source tree. "
                      "Set SPECULA_SOURCE_PATH (and VCPKG_KEEP_ENV_VARS=SPECULA_SOURCE_PATH).")
endif()
file(STRINGS "${SOURCE_PATH}/include/specula/version.hpp" _specula_version_line
     REGEX "^#define SPECULA_VERSION_STRING \"[^\"]*\"")
string(REGEX REPLACE ".*\"([^\"]*)\".*" "\\1" _specula_source_version "${_specula_version_line}")
if(NOT _specula_source_version STREQUAL VERSION)
  message(FATAL_ERROR "specula: the port is version ${VERSION} but ${SOURCE_PATH} is "
                      "version '${_specula_source_version}' (include/specula/version.hpp).")
endif()

# Header-only: configure/install once, no debug tree.
set(VCPKG_BUILD_TYPE release)

# Feature "testing" off: make sure Boost is not picked up (so specula::testing is
# not installed) even if another port installed it.
vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
  INVERTED_FEATURES
    testing CMAKE_DISABLE_FIND_PACKAGE_Boost
)

# SPECULA_ENABLE_CUDA=OFF: the CUDA headers are installed either way and the
# installed config synthesises specula::cuda from the consumer's CUDAToolkit, so
# nvcc is not needed (nor probed) while building the port. The "cuda" feature
# only pulls in vcpkg's `cuda` port, which locates the toolkit.
vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    ${FEATURE_OPTIONS}
    -DSPECULA_BUILD_TESTS=OFF
    -DSPECULA_BUILD_BENCH=OFF
    -DSPECULA_BUILD_EXAMPLES=OFF
    -DSPECULA_ENABLE_CUDA=OFF
)

vcpkg_cmake_install()

# CMake installs the package files to share/cmake/specula (SPECULA_INSTALL_CMAKEDIR);
# vcpkg wants them in share/specula.
vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/specula)

# Header-only: no libraries, no debug tree.
file(REMOVE_RECURSE
  "${CURRENT_PACKAGES_DIR}/debug"
  "${CURRENT_PACKAGES_DIR}/lib"
)

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")

vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
