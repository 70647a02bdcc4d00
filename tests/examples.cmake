# The example scripts (examples/disagg_*_example.sh) in a small
# configuration, and the fault tests of the pipeline: real redis-server,
# ecstore-server and worker processes (label "examples").
set(_ecs_example_cases 1e1pd-ecstore 1e1p1d-ecstore-tcp 1e1pd-disk 1e1p1d-redis
  fault-server-down fault-evict fault-kv-timeout)
foreach(_c ${_ecs_example_cases})
  add_test(NAME examples_${_c}
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_examples.sh ${CMAKE_BINARY_DIR} ${_c})
  set_tests_properties(examples_${_c} PROPERTIES TIMEOUT 240 LABELS examples
    ENVIRONMENT "ECS_BIN_DIR=${CMAKE_BINARY_DIR}/bin;ECS_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endforeach()

# The examples' wire codec and stand-in model (unit, no processes).
ecs_add_test(test_examples_wire SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_examples_wire.c
  LABELS "unit;examples" LIBS ecs_examples)
