# The Python binding (ec_connector/python): one ctest test that runs the
# pytest suite under tests/python against this build's libecstore and
# ecstore-server (real redis-server and ecstore-server processes, started by
# tests/python/conftest.py) and vLLM's own modules.  ECS_PYTHON is the
# venv scripts/pyenv.sh makes (scripts/test.sh passes it); an interpreter
# that lacks pytest, numpy, torch or vLLM fails the test, it never skips.
# It exits 77 (skipped) in a sanitizer build: an ASan libecstore cannot be
# loaded into a python that was not started with the ASan runtime
# preloaded (docs/python.md says how to do that by hand).
set(ECS_PYTHON /usr/bin/python3 CACHE FILEPATH "Interpreter for the Python tests: $(scripts/pyenv.sh)/bin/python")

# Prints the C layout of the structs the binding mirrors (test_abi.py).
add_executable(ecs_py_abi ${CMAKE_CURRENT_LIST_DIR}/python/abi_check.c)
target_include_directories(ecs_py_abi PRIVATE ${CMAKE_SOURCE_DIR}/include)

if(ECS_SANITIZE)
  set(_ecs_py_sanitize 1)
else()
  set(_ecs_py_sanitize 0)
endif()
add_test(NAME test_python COMMAND ${ECS_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/python/run_tests.py)
set_tests_properties(test_python PROPERTIES
  ENVIRONMENT "ECSTORE_LIB=${CMAKE_BINARY_DIR}/lib/libecstore.so;ECS_BIN_DIR=${CMAKE_BINARY_DIR}/bin;ECS_SANITIZE=${_ecs_py_sanitize};PYTHONDONTWRITEBYTECODE=1;HF_HUB_OFFLINE=1;VLLM_NO_USAGE_STATS=1;DO_NOT_TRACK=1"
  WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
  LABELS python
  TIMEOUT 900
  SKIP_RETURN_CODE 77)
