# The optional integrations' targets (docs/install.md, "Integrations"). Each file in this folder finds
# one dependency quietly and, when it is there, makes the target resilience::<name> with
# resilience_add_integration(). The same files run in two places:
#   - in this project's build (CMakeLists.txt), where they make resilience_<name> and its alias;
#   - in the installed package (resilienceConfig.cmake), with RESILIENCE_PACKAGE_IMPORTED set, where
#     they make the imported target resilience::<name> on top of resilience::resilience.
# A file must not fail when its dependency is missing: it leaves the target out.
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
