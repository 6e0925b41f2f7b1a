# SPDX-License-Identifier: MIT
# The object of tests/gcc_no_uncalled_coroutines.cpp (g++ -O0, the library's headers and no call) holds no
# coroutine: the body g++ compiles for one is named "[clone .actor]".
#     cmake -DNM=<nm> -DOBJECTS=<object files> -P gcc_no_uncalled_coroutines.cmake
foreach(object IN LISTS OBJECTS)
    execute_process(COMMAND "${NM}" -C "${object}" OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
        message(FATAL_ERROR "${NM} failed on ${object}")
    endif()
    string(REGEX MATCHALL "[^\n]*\\[clone \\.actor\\][^\n]*" actors "${symbols}")
    if(actors)
        list(JOIN actors "\n" listed)
        message(FATAL_ERROR "A g++ -O0 file that includes the headers and calls nothing compiles these "
            "coroutines: make each a template (see include/resilience/redis/connection.hpp), or not a "
            "coroutine.\n${listed}")
    endif()
endforeach()
message(STATUS "no coroutine in ${OBJECTS}")
