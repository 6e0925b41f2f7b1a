# The optional integrations' targets (docs/install.md, "Integrations"). Each file in this folder finds
# one dependency quietly and, when it is there, makes the target resilience::<name> with
# resilience_add_integration(). The same files run in two places:
#   - in this project's build (CMakeLists.txt), where they make resilience_<name> and its alias, and only
#     when their option asks (resilience_integration_wanted below);
#   - in the installed package (resilienceConfig.cmake), with RESILIENCE_PACKAGE_IMPORTED set, where
#     they make the imported target resilience::<name> on top of resilience::resilience.
# In the package, a file must not fail when its dependency is missing: it leaves the target out (a
# REQUIRED component then fails find_package). In this build it fails only when its option was set ON.
include_guard(GLOBAL)

# resilience_add_integration(<name> [LINK <item>...] [DEFINITIONS <def>...] [INCLUDE_DIRS <dir>...])
function(resilience_add_integration name)
    cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "LINK;DEFINITIONS;INCLUDE_DIRS")
    if(RESILIENCE_PACKAGE_IMPORTED)
        if(TARGET resilience::${name})
            return()
        endif()
        add_library(resilience::${name} INTERFACE IMPORTED)
        set(target resilience::${name})
        set(core resilience::resilience)
    else()
        add_library(resilience_${name} INTERFACE)
        add_library(resilience::${name} ALIAS resilience_${name})
        set(target resilience_${name})
        set(core resilience)
    endif()
    if(arg_INCLUDE_DIRS)
        target_include_directories(${target} SYSTEM INTERFACE ${arg_INCLUDE_DIRS})
    endif()
    if(arg_DEFINITIONS)
        target_compile_definitions(${target} INTERFACE ${arg_DEFINITIONS})
    endif()
    target_link_libraries(${target} INTERFACE ${core} ${arg_LINK})
endfunction()

# The options of this project's build (never called in the installed package, where the components asked
# of find_package choose the files that run). A subproject that links only resilience::resilience must
# not pay for integrations it does not use: their lookups, the packages those pull in, their messages.
# So an option that was set (-D, a preset, or a parent's set() before adding this project) decides, and
# one that was not is on in the top-level project, lenient there (a missing dependency is skipped, so
# scripts/dev works on a machine without some of them), and off in a subproject, which looks nothing up.

# resilience_integration_wanted(<option> <out-var>): whether to look the dependency of <option> up.
function(resilience_integration_wanted option out_var)
    if(DEFINED ${option})
        if(${option})
            set(wanted ON)
        else()
            set(wanted OFF)
        endif()
    else()
        set(wanted ${PROJECT_IS_TOP_LEVEL})
    endif()
    set(${out_var} ${wanted} PARENT_SCOPE)
endfunction()

# resilience_integration_option(<option> <found> <out-var> DOC <doc> NEEDS <what, how to install>
#                               TARGETS <name>... [DETAIL <what was found>])
# Defines <option> once the lookup is done, and sets <out-var> to whether to make the targets. An option
# set ON whose dependency is missing stops the configure: whoever set it wants the target. Unset, it takes
# <found> (OFF when nothing was looked up).
function(resilience_integration_option option found out_var)
    cmake_parse_arguments(PARSE_ARGV 3 arg "" "DOC;NEEDS;DETAIL" "TARGETS")
    list(TRANSFORM arg_TARGETS PREPEND "resilience::" OUTPUT_VARIABLE targets)
    list(JOIN targets " and " targets)
    if(DEFINED ${option} AND ${option} AND NOT found)
        message(FATAL_ERROR "resilience: ${option} needs ${arg_NEEDS}, or -D${option}=OFF")
    endif()
    set(was_set OFF)
    if(DEFINED ${option})
        set(was_set ON)
    endif()
    option(${option} "${arg_DOC}" ${found})
    if(${option})
        if(arg_DETAIL)
            message(STATUS "resilience: ${targets} enabled (${arg_DETAIL})")
        else()
            message(STATUS "resilience: ${targets} enabled")
        endif()
        set(${out_var} ON PARENT_SCOPE)
        return()
    endif()
    set(${out_var} OFF PARENT_SCOPE)
    # A subproject hears nothing of what it did not ask for.
    if(NOT PROJECT_IS_TOP_LEVEL)
        return()
    elseif(was_set)
        message(STATUS "resilience: ${targets} off (${option}=OFF)")
    else()
        message(STATUS "resilience: ${targets} not available: ${option} needs ${arg_NEEDS}")
    endif()
endfunction()
