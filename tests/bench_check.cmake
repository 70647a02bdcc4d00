# The benchmark harness, checked (never its figures: STYLE.md, practice 8).
# bench_compare_quick runs `ecstore-bench compare --quick` into a fresh
# directory and passes when the table (compare.txt with its header and the
# targets block, compare.md) and the CSV files were written, whatever the
# numbers.  It starts its own redis-server, ecstore-servers and, when
# installed, memcached.  Label "bench": `ctest -L bench` runs it alone,
# `ctest -LE bench` leaves it out.
#
# The script the test runs (cmake -P, with BENCH and OUT defined); the test
# itself is declared in tests/CMakeLists.txt.
file(REMOVE_RECURSE ${OUT})
file(MAKE_DIRECTORY ${OUT})
execute_process(COMMAND ${BENCH} compare --quick --out ${OUT} --disk-dir ${OUT}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 150)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ecstore-bench compare --quick exited ${rc}\n${out}\n${err}")
endif()
foreach(f compare.txt compare.md compare.csv scaling-conns.csv scaling-pool.csv scaling-objects.csv)
  if(NOT EXISTS ${OUT}/${f})
    message(FATAL_ERROR "compare --quick did not write ${f}\n${out}\n${err}")
  endif()
endforeach()
file(READ ${OUT}/compare.txt txt)
foreach(want "# ecstore-bench compare; machine:" "ecstore-tcp" "ecstore-shm-copy" "raw-tcp" "memcpy"
        "redis" "## targets")
  string(FIND "${txt}" "${want}" at)
  if(at LESS 0)
    message(FATAL_ERROR "compare.txt lacks '${want}'\n${txt}")
  endif()
endforeach()
file(STRINGS ${OUT}/compare.csv rows)
list(LENGTH rows n)
if(n LESS 10)
  message(FATAL_ERROR "compare.csv has ${n} lines")
endif()
file(REMOVE_RECURSE ${OUT})
