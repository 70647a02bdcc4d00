# The examples' stand-in engine instances (docs/examples.md): a worker with
# roles (encoder, prefill, decode, pd), the proxy, the load generator and
# the single-process reference.  They share the model, the wire protocol
# and small helpers through one static library, so every binary computes
# with the same code and flags (the token comparison relies on it).
add_library(ecs_examples STATIC
  ${CMAKE_CURRENT_LIST_DIR}/ex_model.c
  ${CMAKE_CURRENT_LIST_DIR}/ex_wire.c
  ${CMAKE_CURRENT_LIST_DIR}/ex_util.c)
target_link_libraries(ecs_examples PUBLIC ecstore_static m)
target_include_directories(ecs_examples PUBLIC ${CMAKE_SOURCE_DIR})

foreach(_ex worker proxy loadgen reference)
  add_executable(ecs-example-${_ex} ${CMAKE_CURRENT_LIST_DIR}/ex_${_ex}.c)
  target_link_libraries(ecs-example-${_ex} PRIVATE ecs_examples)
endforeach()
